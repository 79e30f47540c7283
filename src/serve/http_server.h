// The OpenAI-compatible HTTP front of `sluice serve` (docs/SERVING.md), on cpp-httplib:
//   GET  /                      the chat page (serve/web/index.html, embedded at build time)
//   GET  /health                {"status":"ok"} (no API key needed)
//   GET  /metrics               Prometheus text
//   GET  /v1/models             the one model
//   POST /v1/chat/completions   messages through the model's chat template; stream via SSE
//   POST /v1/completions        raw prompt (string or token ids)
// Handlers run on cpp-httplib's worker threads; they validate the JSON body (400 naming the field
// for malformed JSON, wrong types, unknown fields, out-of-range values), submit to the Scheduler
// and read the request's events. A client that disconnects mid-stream cancels its request.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "decode/sampler.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "serve/scheduler.h"

namespace sluice::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;       // 0: any free port (HttpServer::port() tells which)
  std::string api_key;   // non-empty: every endpoint but /health and / needs "Authorization: Bearer KEY"
  std::string model_id;  // the name /v1/models lists
  decode::SamplerParams sampling;  // defaults for fields a request leaves out (seed: random per request)
  bool seed_given = false;         // sampling.seed is the default seed (else a random one per request)
  int http_threads = 128;          // connections served at once (each stream holds one)
  bool add_bos = true;             // prepend BOS to prompts when the model asks for it
};

class HttpServer {
 public:
  // `chat` may be null (no template: /v1/chat/completions answers 400). All references must
  // outlive the server.
  HttpServer(Scheduler& scheduler, const model::Tokenizer& tokenizer, const model::ChatTemplate* chat,
             ServerOptions opts);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port. Error (kIo) naming the address when it cannot.
  Status bind();
  int port() const;
  // Serves until stop(); then waits for the handlers in flight to return.
  Status run();
  // Stops accepting connections (thread-safe; from the signal watcher).
  void stop();
  // After stop() and the scheduler's shutdown: ends the read side of every connection still open,
  // so connections idle between requests (keep-alive) close now instead of at their timeout and
  // run() returns. Responses being written still go out.
  void close_connections();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// True when this build has the HTTP server (cpp-httplib was found at configure time).
bool http_available();

}  // namespace sluice::serve
