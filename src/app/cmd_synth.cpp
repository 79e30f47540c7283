// sluice synth SHAPE -o FILE [--type T] [shape overrides]: writes a random-but-valid GGUF.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "app/commands.h"
#include "app/synth.h"

namespace sluice::app {

int cmd_synth(int argc, char** argv) {
  std::string names;
  for (const auto& n : shape_names()) names += (names.empty() ? "" : " | ") + n;
  CLI::App app{"Write a random-but-valid GGUF of a named shape (" + names + "); options override the shape's dimensions",
               "sluice synth"};
  std::string shape_name, out, type = "q4_k_m", embd_type;
  uint64_t seed = 1;
  unsigned threads = 0;
  std::optional<uint32_t> layers, dim, ffn, heads, kv_heads, head_dim, vocab, experts, experts_used, shared_ffn, ctx,
      sliding_window, swa_period;
  std::optional<float> rope_theta, route_skew;
  std::optional<std::string> arch;
  bool rope_scaling = false, tied = false;
  app.add_option("shape", shape_name, names)->required();
  app.add_option("-o,--output", out, "output GGUF file")->required();
  app.add_option("--type", type, "q4_k_m (default), q6_k, q8_0, f16, or any format name");
  app.add_option("--embd-type", embd_type,
                 "token_embd's format (the output's too with --tied-output; default: as --type chooses)");
  app.add_option("--arch", arch,
                 "llama | qwen2 | qwen3 (with --experts: mixtral-style llama, qwen2moe, qwen3moe) | gemma3");
  app.add_option("--layers", layers, "number of layers");
  app.add_option("--dim", dim, "embedding dimension");
  app.add_option("--ffn", ffn, "feed-forward dimension (per expert for MoE)");
  app.add_option("--heads", heads, "attention heads");
  app.add_option("--kv-heads", kv_heads, "key/value heads");
  app.add_option("--head-dim", head_dim, "head dimension (default dim / heads)");
  app.add_option("--vocab", vocab, "vocabulary size");
  app.add_option("--experts", experts, "experts per layer (0 = dense)");
  app.add_option("--experts-used", experts_used, "experts used per token");
  app.add_option("--shared-ffn", shared_ffn, "qwen2moe: the shared expert's feed-forward dimension");
  app.add_option("--route-skew", route_skew,
                 "MoE: Zipf exponent S of expert popularity (rank r gets ~r^-S of the selections, per layer; "
                 "default 0: unbiased random router)");
  app.add_option("--ctx", ctx, "context length");
  app.add_option("--sliding-window", sliding_window, "gemma3: sliding window of the local layers (default 0: none)");
  app.add_option("--swa-period", swa_period, "gemma3: every N-th layer is global (default 6)");
  app.add_option("--rope-theta", rope_theta, "rope frequency base");
  app.add_flag("--rope-scaling", rope_scaling, "llama-3.1-style rope scaling (rope_freqs.weight)");
  app.add_flag("--tied-output", tied, "no output.weight (tied to token_embd)");
  app.add_option("--seed", seed, "random seed (same seed, same file)");
  app.add_option("--threads", threads, "generator threads (default: all cores)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitBadInput;
  }
  auto shape = named_shape(shape_name);
  if (!shape.is_ok()) {
    std::fprintf(stderr, "sluice synth: %s\n", shape.status().message().c_str());
    return kExitBadInput;
  }
  SynthShape& s = shape.value();
  if (arch) s.arch = *arch;
  if (layers) s.layers = *layers;
  if (dim) s.dim = *dim;
  if (ffn) s.ffn = *ffn;
  if (heads) s.heads = *heads;
  if (kv_heads) s.kv_heads = *kv_heads;
  if (head_dim) s.head_dim = *head_dim;
  if (vocab) s.vocab = *vocab;
  if (experts) s.experts = *experts;
  if (experts_used) s.experts_used = *experts_used;
  if (shared_ffn) s.shared_ffn = *shared_ffn;
  if (route_skew) s.route_skew = *route_skew;
  if (experts && *experts > 0 && !experts_used && s.experts_used == 0) s.experts_used = std::min(2u, *experts);
  // A named MoE shape made dense (--experts 0) or moved to another architecture drops the
  // expert settings it brought, unless they were given too (then validate() names the clash).
  if (experts && *experts == 0 && !experts_used) s.experts_used = 0;
  if (((experts && *experts == 0) || (arch && *arch != "qwen2")) && !shared_ffn) s.shared_ffn = 0;
  if (ctx) s.ctx = *ctx;
  if (sliding_window) s.sliding_window = *sliding_window;
  if (swa_period) s.swa_period = *swa_period;
  if (rope_theta) s.rope_theta = *rope_theta;
  s.rope_scaling = s.rope_scaling || rope_scaling;
  s.tied_output = s.tied_output || tied;

  auto mix = parse_type_mix(type);
  if (!mix.is_ok()) {
    std::fprintf(stderr, "sluice synth: %s\n", mix.status().message().c_str());
    return kExitBadInput;
  }
  if (!embd_type.empty()) {
    auto t = parse_weight_format(embd_type, "--embd-type");
    if (!t.is_ok()) {
      std::fprintf(stderr, "sluice synth: %s\n", t.status().message().c_str());
      return kExitBadInput;
    }
    mix->embd = *t;
  }
  auto plan = make_plan(s, *mix, seed);
  if (!plan.is_ok()) {
    std::fprintf(stderr, "sluice synth: %s\n", plan.status().message().c_str());
    return kExitBadInput;
  }
  if (plan->fallbacks) {
    std::fprintf(stderr,
                 "sluice synth: %u tensors fall back to another format as llama.cpp's quantizer does (row length "
                 "not a multiple of the format's block)\n",
                 plan->fallbacks);
  }
  SynthStats stats;
  Status st = write_synth(*plan, out, seed, threads, &stats, core::progress_bar("writing " + out));
  if (!st.is_ok()) {
    std::fprintf(stderr, "sluice synth: %s\n", st.message().c_str());
    return st.code() == ErrorCode::kInvalidArgument ? kExitBadInput : kExitFailure;
  }
  std::printf("wrote %s: %s %s, %zu tensors, %llu bytes (%.2f GiB) in %.2f s, %.2f GB/s\n", out.c_str(),
              s.name.c_str(), mix->name.c_str(), stats.tensors, static_cast<unsigned long long>(stats.bytes),
              static_cast<double>(stats.bytes) / (1ull << 30), stats.seconds,
              static_cast<double>(stats.bytes) / 1e9 / std::max(stats.seconds, 1e-9));
  return kExitOk;
}

}  // namespace sluice::app
