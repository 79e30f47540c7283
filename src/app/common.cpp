#include "app/common.h"

#include <cctype>
#include <chrono>
#include <filesystem>
#include <map>

#include "app/commands.h"
#include "quant/quant.h"

namespace sluice::app {

int exit_code_for(const Status& st) {
  switch (st.code()) {
    case ErrorCode::kOk: return kExitOk;
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kCorruptFile:
    case ErrorCode::kUnsupported:
    case ErrorCode::kIo: return kExitBadInput;
    case ErrorCode::kOutOfMemory:
    case ErrorCode::kInternal: return kExitFailure;
  }
  return kExitFailure;
}

int report_error(std::string_view command, const Status& st) {
  std::fprintf(stderr, "sluice %.*s: %s\n", int(command.size()), command.data(), st.message().c_str());
  return exit_code_for(st);
}

Result<ModelMeta> open_model_meta(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return io_error("model file '" + path + "' does not exist");
  if (std::filesystem::is_directory(path, ec)) return io_error("model path '" + path + "' is a directory");
  auto file = gguf::File::open(path);
  if (!file.is_ok()) return file.status();
  ModelMeta meta;
  meta.file = std::make_unique<gguf::File>(std::move(file).value());
  auto tok = model::Tokenizer::from_gguf(*meta.file);
  if (!tok.is_ok()) return Status(tok.status().code(), path + ": tokenizer: " + tok.status().message());
  meta.tokenizer = std::move(tok).value();
  return meta;
}

Result<std::unique_ptr<model::Model>> load_weights(const ModelFlags& f, double& seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  model::LoadOptions opts;
  opts.n_ctx = f.n_ctx;
  opts.n_threads = f.n_threads;
  opts.backend = backend_kind(f);
  opts.cuda_graphs = !f.no_graphs;
  auto m = model::Model::load(f.model_path, opts);
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return m;
}

Result<model::ChatTemplate> chat_template_for(const gguf::File& file, const std::string& override_name) {
  if (!override_name.empty()) return model::ChatTemplate::by_name(override_name);
  const gguf::Value* v = file.find("tokenizer.chat_template");
  const std::string text = v != nullptr && v->type == gguf::ValueType::kString ? v->s : "";
  auto t = model::ChatTemplate::detect(text);
  if (!t.is_ok()) {
    return invalid_argument(file.path() + ": " + t.status().message() +
                            "; choose one with --chat-template chatml|llama3|mistral|llama2|gemma");
  }
  return t;
}

ModelSummary summarize(const gguf::File& file) {
  ModelSummary s;
  std::map<quant::Type, uint64_t> bytes_by_type;
  for (const auto& t : file.tensors()) {
    s.n_params += t.n_elements();
    s.n_bytes += t.nbytes;
    bytes_by_type[t.type] += t.nbytes;
  }
  auto str = [&](const char* key) {
    const gguf::Value* v = file.find(key);
    return v != nullptr && v->type == gguf::ValueType::kString ? v->s : std::string();
  };
  std::string d = str("general.architecture");
  if (d.empty()) d = "?";
  std::string size = str("general.size_label");
  if (size.empty()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1fB", double(s.n_params) / 1e9);
    size = buf;
  }
  d += " " + size;
  // The format holding most of the bytes names the quantization, as llama-bench's does.
  quant::Type main_type = quant::Type::kF32;
  uint64_t most = 0;
  for (const auto& [type, n] : bytes_by_type) {
    if (n > most) most = n, main_type = type;
  }
  if (most > 0) {
    std::string q = quant::type_name(main_type);
    for (auto& c : q) c = char(std::toupper(static_cast<unsigned char>(c)));
    d += " " + q;
  }
  s.description = d;
  return s;
}

void print_stats(FILE* out, double load_s, const decode::Timings& t, uint64_t weight_bytes_per_token,
                 const char* backend) {
  std::fprintf(out, "load:    %.3f s (backend %s)\n", load_s, backend);
  std::fprintf(out, "prefill: %d tokens in %.3f s = %.1f tok/s\n", t.n_prompt, t.prefill_s, t.prefill_tok_s());
  if (t.n_decode > 0) {
    const double gbs = double(weight_bytes_per_token) * t.decode_tok_s() / 1e9;
    std::fprintf(out, "decode:  %d tokens in %.3f s = %.1f tok/s\n", t.n_decode, t.decode_s, t.decode_tok_s());
    std::fprintf(out, "weights: %.1f MB per decoded token x %.1f tok/s = %.2f GB/s\n",
                 double(weight_bytes_per_token) / 1e6, t.decode_tok_s(), gbs);
  } else {
    std::fprintf(out, "decode:  0 tokens (no decode step ran)\n");
    std::fprintf(out, "weights: %.1f MB per decoded token (no decode rate to report)\n",
                 double(weight_bytes_per_token) / 1e6);
  }
}

void accumulate(decode::Timings& a, const decode::Timings& b) {
  a.n_prompt += b.n_prompt;
  a.prefill_s += b.prefill_s;
  a.n_decode += b.n_decode;
  a.decode_s += b.decode_s;
}

bool print_to_stdout(std::string_view piece) {
  std::fwrite(piece.data(), 1, piece.size(), stdout);
  std::fflush(stdout);
  return true;
}

}  // namespace sluice::app
