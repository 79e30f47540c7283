#include "serve/http_server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <filesystem>

#include "serve/web_index.h"  // generated: kWebIndexHtml (serve/web/index.html)

namespace sluice::serve {
namespace {

// Connections the kernel queues for accept() (the HTTP threads take them from there).
constexpr int kListenBacklog = 1024;

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Output JSON: invalid UTF-8 (a token that is part of a character) becomes U+FFFD instead of
// throwing.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A request error: HTTP status, message, the offending field (OpenAI's "param").
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;
  std::string type = "invalid_request_error";
};

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  res.set_content(dump(json{{"error", err}}), "application/json");
}

// ---- JSON body validation: every error names the field ----

std::string type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

struct Fields {
  const json& body;
  std::optional<ApiError> error;

  bool fail(const std::string& field, const std::string& msg) {
    if (!error) error = ApiError{400, msg, field};
    return false;
  }
  const json* get(const char* name) {
    auto it = body.find(name);
    if (it == body.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool number(const char* name, float& out, double lo, double hi) {
    const json* v = get(name);
    if (!v) return true;
    if (!v->is_number()) return fail(name, "'" + std::string(name) + "' must be a number, got " + type_name(*v));
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < lo || d > hi) {
      std::ostringstream s;
      s << "'" << name << "' must be in [" << lo << ", " << hi << "], got " << d;
      return fail(name, s.str());
    }
    out = float(d);
    return true;
  }
  bool integer(const char* name, int64_t& out, int64_t lo, int64_t hi) {
    const json* v = get(name);
    if (!v) return true;
    if (!v->is_number_integer()) {
      return fail(name, "'" + std::string(name) + "' must be an integer, got " + type_name(*v));
    }
    // Unsigned values above int64 range read as huge; compare in the signed domain via the json type.
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
      return fail(name, "'" + std::string(name) + "' is out of range");
    }
    const int64_t i = v->get<int64_t>();
    if (i < lo || i > hi) {
      return fail(name, "'" + std::string(name) + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                            "], got " + std::to_string(i));
    }
    out = i;
    return true;
  }
  bool boolean(const char* name, bool& out) {
    const json* v = get(name);
    if (!v) return true;
    if (!v->is_boolean()) return fail(name, "'" + std::string(name) + "' must be a boolean, got " + type_name(*v));
    out = v->get<bool>();
    return true;
  }
  bool string(const char* name, std::string& out) {
    const json* v = get(name);
    if (!v) return true;
    if (!v->is_string()) return fail(name, "'" + std::string(name) + "' must be a string, got " + type_name(*v));
    out = v->get<std::string>();
    return true;
  }
};

// What both completion endpoints accept besides their prompt.
struct Common {
  RequestParams params;
  bool stream = false;
  bool include_usage = false;
};

std::optional<ApiError> parse_common(Fields& f, Common& c, const ServerOptions& opts, bool chat) {
  auto& p = c.params;
  p.sampling = opts.sampling;
  if (!opts.seed_given) p.sampling.seed = std::random_device{}() * 0x100000001ull ^ std::random_device{}();
  std::string model;
  f.string("model", model);
  f.boolean("stream", c.stream);
  if (const json* so = f.get("stream_options")) {
    if (!so->is_object()) {
      f.fail("stream_options", "'stream_options' must be an object, got " + type_name(*so));
    } else {
      for (const auto& [k, v] : so->items()) {
        if (k != "include_usage") {
          f.fail("stream_options." + k, "unknown field 'stream_options." + k + "'");
        } else if (!v.is_boolean()) {
          f.fail("stream_options.include_usage", "'stream_options.include_usage' must be a boolean, got " + type_name(v));
        } else {
          c.include_usage = v.get<bool>();
        }
      }
    }
  }
  int64_t max_tokens = -1;
  f.integer("max_tokens", max_tokens, 1, 1 << 24);
  if (chat) f.integer("max_completion_tokens", max_tokens, 1, 1 << 24);
  p.max_tokens = int(max_tokens);
  if (!chat && !f.get("max_tokens")) p.max_tokens = 16;  // OpenAI's default for /v1/completions
  f.number("temperature", p.sampling.temperature, 0, 2);
  f.number("top_p", p.sampling.top_p, 0, 1);
  if (p.sampling.top_p <= 0) f.fail("top_p", "'top_p' must be in (0, 1], got 0");
  int64_t top_k = p.sampling.top_k;
  f.integer("top_k", top_k, 0, 1 << 20);
  p.sampling.top_k = int(top_k);
  f.number("min_p", p.sampling.min_p, 0, 1);
  f.number("repeat_penalty", p.sampling.repeat_penalty, 1e-3, 100);
  int64_t seed = 0;
  if (f.get("seed")) {
    if (f.integer("seed", seed, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
      p.sampling.seed = uint64_t(seed);
    }
  }
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    float v = 0;
    if (f.number(name, v, -2, 2) && v != 0) {
      f.fail(name, "'" + std::string(name) + "' is not supported (only 0); use 'repeat_penalty'");
    }
  }
  int64_t n = 1;
  f.integer("n", n, 1, 1);
  std::string user;
  f.string("user", user);
  f.boolean("ignore_eos", p.ignore_eos);
  f.boolean("cache_prompt", p.cache_prompt);
  if (const json* s = f.get("stop")) {
    if (s->is_string()) {
      p.stop.push_back(s->get<std::string>());
    } else if (s->is_array() && s->size() <= 4) {
      for (size_t i = 0; i < s->size(); ++i) {
        if (!(*s)[i].is_string()) {
          f.fail("stop", "'stop[" + std::to_string(i) + "]' must be a string, got " + type_name((*s)[i]));
          break;
        }
        p.stop.push_back((*s)[i].get<std::string>());
      }
    } else {
      f.fail("stop", "'stop' must be a string or an array of at most 4 strings");
    }
    for (const auto& st : p.stop) {
      if (st.empty()) f.fail("stop", "'stop' strings must not be empty");
    }
  }
  return f.error;
}

std::optional<ApiError> check_unknown(const json& body, std::initializer_list<const char*> allowed) {
  if (!body.is_object()) return ApiError{400, "the request body must be a JSON object, got " + type_name(body), ""};
  for (const auto& [k, v] : body.items()) {
    bool ok = false;
    for (const char* a : allowed) ok = ok || k == a;
    if (!ok) return ApiError{400, "unknown field '" + k + "'", k};
  }
  return std::nullopt;
}

std::optional<ApiError> parse_body(const std::string& text, json& out) {
  try {
    out = json::parse(text);
  } catch (const json::parse_error& e) {
    return ApiError{400, std::string("malformed JSON in the request body: ") + e.what(), ""};
  }
  return std::nullopt;
}

// Calls fn(fd, peer address, peer port) for every open TCP connection of this process whose local
// port is `local_port` (cpp-httplib 0.11, Debian's, hands out neither sockets nor connections).
template <class F>
void for_each_connection(int local_port, F&& fn) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    try {
      fd = std::stoi(e.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    sockaddr_storage peer{}, local{};
    socklen_t pl = sizeof peer, ll = sizeof local;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0 || peer.ss_family != local.ss_family) {
      continue;
    }
    char ip[INET6_ADDRSTRLEN] = {};
    int peer_port = 0, own_port = 0;
    if (peer.ss_family == AF_INET) {
      const auto& p4 = reinterpret_cast<const sockaddr_in&>(peer);
      inet_ntop(AF_INET, &p4.sin_addr, ip, sizeof ip);
      peer_port = ntohs(p4.sin_port);
      own_port = ntohs(reinterpret_cast<const sockaddr_in&>(local).sin_port);
    } else if (peer.ss_family == AF_INET6) {
      const auto& p6 = reinterpret_cast<const sockaddr_in6&>(peer);
      inet_ntop(AF_INET6, &p6.sin6_addr, ip, sizeof ip);
      peer_port = ntohs(p6.sin6_port);
      own_port = ntohs(reinterpret_cast<const sockaddr_in6&>(local).sin6_port);
    } else {
      continue;
    }
    if (own_port == local_port && fn(fd, std::string(ip), peer_port)) return;
  }
}

// The connection a handler answers: only a write notices a closed connection, which a
// non-streaming response makes once, at the end. So the handler finds its own socket: the open
// descriptor whose peer is the request's remote address and port and whose local port is the
// server's. httplib closes it only after the handler returns. -1 where none matches.
int connection_socket(const httplib::Request& req, int local_port) {
  int found = -1;
  for_each_connection(local_port, [&](int fd, const std::string& ip, int peer_port) {
    if (peer_port != req.remote_port || ip != req.remote_addr) return false;
    found = fd;
    return true;
  });
  return found;
}

// Whether the client closed (or reset) the connection: a peek at the socket that reads nothing
// and does not wait. A client that half-closes after its request (shutdown(SHUT_WR)) reads as
// gone too; HTTP clients keep the connection open while they wait for the answer.
bool peer_gone(int fd) {
  if (fd < 0) return false;
  char c = 0;
  const ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (r == 0) return true;
  return r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

std::string random_id(const char* prefix) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::random_device rd;
  std::string s = prefix;
  for (int i = 0; i < 24; ++i) s += kHex[rd() % 16];
  return s;
}

json token_bytes_json(const std::string& b) {
  json a = json::array();
  for (unsigned char c : b) a.push_back(int(c));
  return a;
}

}  // namespace

bool http_available() { return true; }

// cpp-httplib listens with a backlog of 5 connections (CPPHTTPLIB_LISTEN_BACKLOG, compiled into
// Debian's shared library). Clients that connect at once beyond that (32 streams of a batch job)
// had their handshakes dropped and retried a second later, or reset. listen() again on the bound
// socket (its fd is a protected member) widens the queue: Linux takes the new backlog, capped at
// net.core.somaxconn.
class Listener final : public httplib::Server {
 public:
  bool widen_backlog(int backlog) { return ::listen(svr_sock_.load(), backlog) == 0; }
};

struct HttpServer::Impl {
  Scheduler& sched;
  const model::Tokenizer& tok;
  const model::ChatTemplate* chat;
  ServerOptions opts;
  Listener svr;
  int bound_port = -1;
  const int64_t created = int64_t(std::time(nullptr));

  std::mutex stats_mu;
  std::map<std::pair<std::string, int>, uint64_t> http_counts;  // (path, status) -> answered

  Impl(Scheduler& s, const model::Tokenizer& t, const model::ChatTemplate* c, ServerOptions o)
      : sched(s), tok(t), chat(c), opts(std::move(o)) {}

  void routes();
  void handle_completion(const httplib::Request& req, httplib::Response& res, bool chat_endpoint);
  std::string metrics_text();
  json logprobs_chat(const std::vector<TokenLogprob>& lps) const;
  void logprobs_completion(const std::vector<TokenLogprob>& lps, json& acc, size_t& offset) const;
};

json HttpServer::Impl::logprobs_chat(const std::vector<TokenLogprob>& lps) const {
  json content = json::array();
  for (const auto& lp : lps) {
    const std::string b = tok.token_bytes(lp.id);
    json top = json::array();
    for (const auto& t : lp.top) {
      const std::string tb = tok.token_bytes(t.id);
      top.push_back({{"token", tb}, {"logprob", t.logprob}, {"bytes", token_bytes_json(tb)}});
    }
    content.push_back({{"token", b}, {"logprob", lp.logprob}, {"bytes", token_bytes_json(b)}, {"top_logprobs", top}});
  }
  return content;
}

void HttpServer::Impl::logprobs_completion(const std::vector<TokenLogprob>& lps, json& acc, size_t& offset) const {
  for (const auto& lp : lps) {
    const std::string b = tok.token_bytes(lp.id);
    acc["tokens"].push_back(b);
    acc["token_logprobs"].push_back(lp.logprob);
    json top = json::object();
    for (const auto& t : lp.top) top[tok.token_bytes(t.id)] = t.logprob;
    acc["top_logprobs"].push_back(top);
    acc["text_offset"].push_back(offset);
    offset += b.size();
  }
}

void HttpServer::Impl::handle_completion(const httplib::Request& req, httplib::Response& res, bool chat_endpoint) {
  json body;
  if (auto e = parse_body(req.body, body)) return send_error(res, *e);
  std::optional<ApiError> err;
  if (chat_endpoint) {
    err = check_unknown(body, {"model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
                               "temperature", "top_p", "top_k", "min_p", "seed", "stop", "logprobs", "top_logprobs",
                               "n", "repeat_penalty", "presence_penalty", "frequency_penalty", "user", "ignore_eos",
                               "cache_prompt"});
  } else {
    err = check_unknown(body, {"model", "prompt", "stream", "stream_options", "max_tokens", "temperature", "top_p",
                               "top_k", "min_p", "seed", "stop", "logprobs", "n", "echo", "repeat_penalty",
                               "presence_penalty", "frequency_penalty", "user", "best_of", "ignore_eos",
                               "cache_prompt"});
  }
  if (err) return send_error(res, *err);

  Fields f{body, std::nullopt};
  Common c;
  if (auto e = parse_common(f, c, opts, chat_endpoint)) return send_error(res, *e);
  auto& p = c.params;

  bool want_logprobs = false;
  std::string text;
  if (chat_endpoint) {
    f.boolean("logprobs", want_logprobs);
    int64_t top = 0;
    f.integer("top_logprobs", top, 0, 20);
    if (f.get("top_logprobs") && !want_logprobs) f.fail("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (want_logprobs) p.top_logprobs = int(top);
    if (f.error) return send_error(res, *f.error);
    const json* msgs = f.get("messages");
    if (!msgs) return send_error(res, {400, "'messages' is required", "messages"});
    if (!msgs->is_array() || msgs->empty()) {
      return send_error(res, {400, "'messages' must be a non-empty array, got " + type_name(*msgs), "messages"});
    }
    std::vector<model::ChatMessage> messages;
    for (size_t i = 0; i < msgs->size(); ++i) {
      const json& m = (*msgs)[i];
      const std::string at = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) return send_error(res, {400, "'" + at + "' must be an object, got " + type_name(m), at});
      model::ChatMessage cm;
      for (const auto& [k, v] : m.items()) {
        if (k != "role" && k != "content" && k != "name") {
          return send_error(res, {400, "unknown field '" + at + "." + k + "'", at + "." + k});
        }
      }
      auto role = m.find("role");
      if (role == m.end() || !role->is_string()) {
        return send_error(res, {400, "'" + at + ".role' must be a string", at + ".role"});
      }
      cm.role = role->get<std::string>();
      if (cm.role != "system" && cm.role != "user" && cm.role != "assistant") {
        return send_error(res, {400, "'" + at + ".role' must be system, user or assistant, got '" + cm.role + "'",
                                at + ".role"});
      }
      auto content = m.find("content");
      if (content == m.end() || content->is_null()) {
        if (cm.role != "assistant") return send_error(res, {400, "'" + at + ".content' is required", at + ".content"});
      } else if (content->is_string()) {
        cm.content = content->get<std::string>();
      } else if (content->is_array()) {
        for (size_t j = 0; j < content->size(); ++j) {
          const json& part = (*content)[j];
          const std::string pat = at + ".content[" + std::to_string(j) + "]";
          auto type = part.is_object() ? part.find("type") : part.end();
          if (!part.is_object() || type == part.end() || *type != "text" || !part.contains("text") ||
              !part["text"].is_string()) {
            return send_error(res, {400, "'" + pat + "' must be {\"type\": \"text\", \"text\": string} (only text "
                                    "content is supported)", pat});
          }
          cm.content += part["text"].get<std::string>();
        }
      } else {
        return send_error(res, {400, "'" + at + ".content' must be a string or an array of text parts, got " +
                                          type_name(*content), at + ".content"});
      }
      messages.push_back(std::move(cm));
    }
    if (!chat) {
      return send_error(res, {400, "this model has no chat template; use /v1/completions or start the server with "
                                   "--chat-template", "messages"});
    }
    auto formatted = chat->apply(messages, true);
    if (!formatted.is_ok()) return send_error(res, {400, formatted.status().message(), "messages"});
    p.prompt = tok.encode(*formatted, opts.add_bos && tok.add_bos_default(), /*parse_special=*/true);
  } else {
    int64_t lp = -1;
    f.integer("logprobs", lp, 0, 5);
    if (f.get("logprobs")) p.top_logprobs = int(lp);
    bool echo = false;
    f.boolean("echo", echo);
    if (echo) f.fail("echo", "'echo' is not supported (only false)");
    int64_t best_of = 1;
    f.integer("best_of", best_of, 1, 1);
    if (f.error) return send_error(res, *f.error);
    const json* prompt = f.get("prompt");
    if (!prompt) return send_error(res, {400, "'prompt' is required", "prompt"});
    if (prompt->is_string()) {
      text = prompt->get<std::string>();
    } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
      text = (*prompt)[0].get<std::string>();
    } else if (prompt->is_array() && !prompt->empty()) {
      for (size_t i = 0; i < prompt->size(); ++i) {
        const json& t = (*prompt)[i];
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.n_vocab()) {
          return send_error(res, {400, "'prompt[" + std::to_string(i) + "]' must be a token id in [0, " +
                                           std::to_string(tok.n_vocab()) + ")", "prompt"});
        }
        p.prompt.push_back(int32_t(t.get<int64_t>()));
      }
    } else {
      return send_error(res, {400, "'prompt' must be a string, an array of one string or an array of token ids, got " +
                                       type_name(*prompt), "prompt"});
    }
    if (p.prompt.empty()) p.prompt = tok.encode(text, opts.add_bos && tok.add_bos_default(), /*parse_special=*/true);
  }
  if (p.prompt.empty()) return send_error(res, {400, "the prompt is empty after tokenization", chat_endpoint ? "messages" : "prompt"});

  const int n_prompt_tokens = int(p.prompt.size());
  auto submitted = sched.submit(std::move(p));
  if (!submitted.is_ok()) {
    const Status& st = submitted.status();
    if (st.code() == ErrorCode::kInvalidArgument) {
      return send_error(res, {400, st.message(), chat_endpoint ? "messages" : "prompt"});
    }
    res.set_header("Retry-After", "1");
    return send_error(res, {503, st.message(), "", "server_error"});
  }
  std::shared_ptr<Request> request = std::move(submitted).value();

  const std::string id = random_id(chat_endpoint ? "chatcmpl-" : "cmpl-");
  const int64_t created_at = int64_t(std::time(nullptr));
  const std::string model_id = opts.model_id;
  auto usage_json = [](const Event& e) {
    return json{{"prompt_tokens", e.n_prompt},
                {"completion_tokens", e.n_generated},
                {"total_tokens", e.n_prompt + e.n_generated},
                {"prompt_tokens_details", {{"cached_tokens", e.n_cached}}}};
  };

  if (!c.stream) {
    // Nothing is written until the whole answer is there: watch the connection meanwhile, so a
    // client that goes away cancels its request (and frees its KV blocks) as a stream's does.
    const int sock = connection_socket(req, bound_port);
    bool cancelled = false;
    std::string out;
    json lp_chat = json::array();
    json lp_cmpl = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
                    {"text_offset", json::array()}};
    size_t offset = 0;
    Event done;
    for (;;) {
      auto e = request->next(std::chrono::milliseconds(200));
      if (!cancelled && peer_gone(sock)) {
        request->cancel();
        cancelled = true;
      }
      if (!e) continue;
      out += e->text;
      if (want_logprobs || request->params.top_logprobs >= 0) {
        if (chat_endpoint) {
          for (auto& x : logprobs_chat(e->logprobs)) lp_chat.push_back(std::move(x));
        } else {
          logprobs_completion(e->logprobs, lp_cmpl, offset);
        }
      }
      if (e->kind == Event::Kind::kDone) {
        done = std::move(*e);
        break;
      }
    }
    if (done.finish == FinishReason::kError) return send_error(res, {500, done.error, "", "server_error"});
    if (done.finish == FinishReason::kCancelled) {
      res.set_header("Retry-After", "1");
      return send_error(res, {503, "the request was cancelled: the server is shutting down", "", "server_error"});
    }
    json choice;
    if (chat_endpoint) {
      choice = {{"index", 0},
                {"message", {{"role", "assistant"}, {"content", out}}},
                {"logprobs", want_logprobs ? json{{"content", lp_chat}} : json(nullptr)},
                {"finish_reason", finish_reason_name(done.finish)}};
    } else {
      choice = {{"index", 0},
                {"text", out},
                {"logprobs", request->params.top_logprobs >= 0 ? lp_cmpl : json(nullptr)},
                {"finish_reason", finish_reason_name(done.finish)}};
    }
    json r = {{"id", id},
              {"object", chat_endpoint ? "chat.completion" : "text_completion"},
              {"created", created_at},
              {"model", model_id},
              {"choices", json::array({choice})},
              {"usage", usage_json(done)}};
    res.set_content(dump(r), "application/json");
    return;
  }

  // Server-sent events: one chunk per event, then [DONE].
  (void)n_prompt_tokens;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  struct StreamState {
    bool started = false;
    bool finished = false;
    size_t offset = 0;
  };
  auto state = std::make_shared<StreamState>();
  const bool include_usage = c.include_usage;
  auto provide =
      [this, request, state, id, created_at, model_id, chat_endpoint, want_logprobs, include_usage, usage_json](
          httplib::DataSink& sink) -> bool {
        auto send = [&](const json& j) {
          const std::string s = "data: " + dump(j) + "\n\n";
          return sink.write(s.data(), s.size());
        };
        auto chunk = [&](json choice) {
          return json{{"id", id},
                      {"object", chat_endpoint ? "chat.completion.chunk" : "text_completion"},
                      {"created", created_at},
                      {"model", model_id},
                      {"choices", json::array({std::move(choice)})}};
        };
        if (state->finished) return false;
        if (!state->started) {
          state->started = true;
          if (chat_endpoint) {
            if (!send(chunk({{"index", 0},
                             {"delta", {{"role", "assistant"}, {"content", ""}}},
                             {"logprobs", nullptr},
                             {"finish_reason", nullptr}}))) {
              request->cancel();
              return false;
            }
          }
        }
        auto idle_since = Clock::now();
        for (;;) {
          auto e = request->next(std::chrono::milliseconds(250));
          if (!e) {
            // A comment line every 2 s while waiting (queued, long prefill): SSE readers ignore it,
            // and a failed write tells us the client is gone.
            if (Clock::now() - idle_since > std::chrono::seconds(2)) {
              static constexpr char kPing[] = ": waiting\n\n";
              if (!sink.write(kPing, sizeof(kPing) - 1)) {
                request->cancel();
                return false;
              }
              idle_since = Clock::now();
            }
            continue;
          }
          const bool done = e->kind == Event::Kind::kDone;
          if (done && (e->finish == FinishReason::kError || e->finish == FinishReason::kCancelled)) {
            const std::string msg = e->finish == FinishReason::kError
                                        ? e->error
                                        : std::string("the request was cancelled: the server is shutting down");
            send(json{{"error", {{"message", msg}, {"type", "server_error"}, {"param", nullptr}, {"code", nullptr}}}});
            static constexpr char kDone[] = "data: [DONE]\n\n";
            sink.write(kDone, sizeof(kDone) - 1);
            state->finished = true;
            sink.done();
            return true;
          }
          if (!e->text.empty() || !e->logprobs.empty()) {
            json choice;
            if (chat_endpoint) {
              choice = {{"index", 0},
                        {"delta", {{"content", e->text}}},
                        {"logprobs", want_logprobs ? json{{"content", logprobs_chat(e->logprobs)}} : json(nullptr)},
                        {"finish_reason", nullptr}};
            } else {
              json lp = nullptr;
              if (request->params.top_logprobs >= 0) {
                lp = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
                      {"text_offset", json::array()}};
                logprobs_completion(e->logprobs, lp, state->offset);
              }
              choice = {{"index", 0}, {"text", e->text}, {"logprobs", lp}, {"finish_reason", nullptr}};
            }
            if (!send(chunk(std::move(choice)))) {
              request->cancel();
              return false;
            }
          }
          if (!done) {
            idle_since = Clock::now();
            continue;
          }
          json last;
          if (chat_endpoint) {
            last = {{"index", 0}, {"delta", json::object()}, {"logprobs", nullptr},
                    {"finish_reason", finish_reason_name(e->finish)}};
          } else {
            last = {{"index", 0}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", finish_reason_name(e->finish)}};
          }
          bool ok = send(chunk(std::move(last)));
          if (ok && include_usage) {
            json u = chunk(json::object());
            u["choices"] = json::array();
            u["usage"] = usage_json(*e);
            ok = send(u);
          }
          static constexpr char kDone[] = "data: [DONE]\n\n";
          if (ok) ok = sink.write(kDone, sizeof(kDone) - 1);
          state->finished = true;
          if (!ok) return false;
          sink.done();
          return true;
        }
      };
  res.set_chunked_content_provider(
      "text/event-stream",
      [provide, request](size_t, httplib::DataSink& sink) -> bool {
        // Runs outside the router's exception handling: nothing may escape into the worker thread.
        try {
          return provide(sink);
        } catch (...) {
          request->cancel();
          return false;
        }
      },
      [request](bool) { request->cancel(); });  // whatever happened, nothing reads the request any more
}

std::string HttpServer::Impl::metrics_text() {
  const Metrics m = sched.metrics();
  std::ostringstream o;
  auto metric = [&](const char* name, const char* type, const char* help, double v) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n' << name << ' ' << v << '\n';
  };
  o << "# HELP sluice_http_requests_total HTTP requests answered, by path and status code.\n"
       "# TYPE sluice_http_requests_total counter\n";
  {
    std::lock_guard lk(stats_mu);
    for (const auto& [k, n] : http_counts) {
      o << "sluice_http_requests_total{path=\"" << k.first << "\",code=\"" << k.second << "\"} " << n << '\n';
    }
  }
  o << "# HELP sluice_requests_total Completion requests that left the scheduler, by outcome.\n"
       "# TYPE sluice_requests_total counter\n"
    << "sluice_requests_total{outcome=\"finished\"} " << m.requests_finished << '\n'
    << "sluice_requests_total{outcome=\"cancelled\"} " << m.requests_cancelled << '\n'
    << "sluice_requests_total{outcome=\"failed\"} " << m.requests_failed << '\n';
  metric("sluice_prompt_tokens_total", "counter", "Prompt tokens evaluated.", double(m.prompt_tokens));
  metric("sluice_prompt_tokens_cached_total", "counter", "Prompt tokens taken from the prompt cache instead.",
         double(m.prompt_tokens_cached));
  metric("sluice_prompt_cache_prefixes", "gauge", "Cached prompt prefixes (sequences kept for later requests).",
         m.cached_prefixes);
  metric("sluice_kv_blocks_cached", "gauge",
         "KV cache blocks held by cached prompt prefixes (a block two of them share counts twice).", m.kv_blocks_cached);
  metric("sluice_generated_tokens_total", "counter", "Tokens generated.", double(m.generated_tokens));
  metric("sluice_requests_queued", "gauge", "Requests waiting for admission.", m.queued);
  metric("sluice_requests_active", "gauge", "Requests admitted (prefilling or generating).", m.active);
  metric("sluice_parallel", "gauge", "Requests that can generate at once.", m.parallel);
  metric("sluice_batch_steps_total", "counter", "Batched forward passes.", double(m.steps));
  metric("sluice_batch_tokens_total", "counter", "Tokens over all batched passes.", double(m.batch_tokens));
  metric("sluice_batch_sequences_total", "counter", "Sequences over all batched passes.", double(m.batch_sequences));
  metric("sluice_batch_size_tokens", "gauge", "Tokens in the last batched pass.", m.last_batch_tokens);
  metric("sluice_batch_size_sequences", "gauge", "Sequences in the last batched pass.", m.last_batch_sequences);
  metric("sluice_kv_blocks_total", "gauge", "KV cache blocks in the pool.", m.kv_blocks_total);
  metric("sluice_kv_blocks_used", "gauge", "KV cache blocks holding positions.", m.kv_blocks_used);
  metric("sluice_kv_blocks_reserved", "gauge",
         "KV cache blocks admitted requests may still take (their blocks at their longest less those they hold).",
         m.kv_blocks_reserved);
  metric("sluice_kv_block_size", "gauge", "Positions per KV block.", m.kv_block_size);
  metric("sluice_kv_usage_ratio", "gauge", "Fraction of the KV pool in use.",
         m.kv_blocks_total > 0 ? double(m.kv_blocks_used) / m.kv_blocks_total : 0.0);
  metric("sluice_busy_seconds_total", "counter", "Wall time spent in batched passes.", m.busy_seconds);
  metric("sluice_tokens_per_second", "gauge", "Generated tokens per second over the last ~10 s.", m.tokens_per_second);
  return o.str();
}

void HttpServer::Impl::routes() {
  svr.set_payload_max_length(16u << 20);
  svr.set_read_timeout(30, 0);
  svr.set_write_timeout(30, 0);
  // Keep-alive: cpp-httplib closes a connection after 5 requests or 5 s idle by default. The
  // first makes a busy client reconnect every 5 requests; the second equals common clients' own
  // idle expiry (httpx, the openai client's: 5 s), so a client may send on a connection the
  // server is closing at that moment (the request fails as a connection error). A client's
  // expiry should come first: 15 s, 100 requests.
  svr.set_keep_alive_max_count(100);
  svr.set_keep_alive_timeout(15);
  const int threads = std::max(4, opts.http_threads);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };

  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opts.api_key.empty() || req.path == "/health" || req.path == "/") return httplib::Server::HandlerResponse::Unhandled;
    const std::string want = "Bearer " + opts.api_key;
    if (req.get_header_value("Authorization") != want) {
      send_error(res, {401, "missing or wrong API key: send 'Authorization: Bearer <key>'", "", "authentication_error"});
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, {500, "internal error: " + what, "", "server_error"});
  });
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) {
      send_error(res, {404, "no such endpoint: " + req.method + " " + req.path, "", "not_found_error"});
    } else if (res.status == 405) {
      send_error(res, {405, "method " + req.method + " is not allowed on " + req.path, ""});
    } else if (res.status == 413) {
      send_error(res, {413, "the request body is too large", ""});
    }
  });
  svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    static const char* kKnown[] = {"/", "/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions"};
    std::string path = "other";
    for (const char* k : kKnown) {
      if (req.path == k) path = k;
    }
    std::lock_guard lk(stats_mu);
    http_counts[{path, res.status}]++;
  });

  svr.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(reinterpret_cast<const char*>(kWebIndexHtml), sizeof(kWebIndexHtml), "text/html; charset=utf-8");
  });
  svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (sched.shutting_down()) {
      res.status = 503;
      res.set_content(R"({"status":"shutting down"})", "application/json");
      return;
    }
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
  svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json m = {{"id", opts.model_id}, {"object", "model"}, {"created", created}, {"owned_by", "sluice"},
              {"meta", {{"n_ctx", sched.n_ctx()}, {"parallel", sched.parallel()}}}};
    res.set_content(dump(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
  });
  svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_completion(req, res, true);
  });
  svr.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_completion(req, res, false);
  });
}

HttpServer::HttpServer(Scheduler& scheduler, const model::Tokenizer& tokenizer, const model::ChatTemplate* chat,
                       ServerOptions opts)
    : impl_(std::make_unique<Impl>(scheduler, tokenizer, chat, std::move(opts))) {
  impl_->routes();
}

HttpServer::~HttpServer() = default;

Status HttpServer::bind() {
  auto& i = *impl_;
  if (i.opts.port == 0) {
    i.bound_port = i.svr.bind_to_any_port(i.opts.host);
    if (i.bound_port < 0) return io_error("cannot listen on " + i.opts.host + " (any port)");
  } else {
    if (!i.svr.bind_to_port(i.opts.host, i.opts.port)) {
      return io_error("cannot listen on " + i.opts.host + ":" + std::to_string(i.opts.port) +
                      " (address in use or not available)");
    }
    i.bound_port = i.opts.port;
  }
  if (!i.svr.widen_backlog(kListenBacklog)) {
    return io_error("cannot widen the listen backlog of " + i.opts.host + ":" + std::to_string(i.bound_port) + ": " +
                    std::strerror(errno));
  }
  return Status::ok();
}

int HttpServer::port() const { return impl_->bound_port; }

Status HttpServer::run() {
  if (!impl_->svr.listen_after_bind()) {
    if (impl_->svr.is_running()) return internal_error("the HTTP server stopped unexpectedly");
  }
  return Status::ok();
}

void HttpServer::stop() { impl_->svr.stop(); }

void HttpServer::close_connections() {
  for_each_connection(impl_->bound_port, [](int fd, const std::string&, int) {
    ::shutdown(fd, SHUT_RD);
    return false;
  });
}

}  // namespace sluice::serve
