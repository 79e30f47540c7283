// `sluice synth`: writes a random-but-valid GGUF of a named or custom shape, so streaming and
// throughput can be exercised at 8B/70B/MoE scale without downloading weights. The file is
// llama.cpp-compatible: complete hyper-parameters, a byte-level BPE tokenizer section, and weights
// whose scale (~1/sqrt(fan_in), norms ~1) keeps activations finite through many layers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

namespace sluice::app {

struct SynthShape {
  std::string name = "custom";
  std::string arch = "llama";  // llama | qwen2 (q/k/v biases) | qwen3 (q/k norms; qwen3moe with experts)
  uint32_t layers = 2;
  uint32_t dim = 256;
  uint32_t ffn = 512;          // per expert for MoE
  uint32_t heads = 4;
  uint32_t kv_heads = 2;
  uint32_t head_dim = 0;       // 0: dim / heads
  uint32_t vocab = 1024;
  uint32_t experts = 0;        // 0: dense
  uint32_t experts_used = 0;
  uint32_t ctx = 4096;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  bool rope_scaling = false;   // llama-3.1 style: rope_freqs.weight (factor 8, 8192 original ctx)
  bool tied_output = false;    // no output.weight (uses token_embd)

  uint32_t n_embd_head() const { return head_dim ? head_dim : dim / (heads ? heads : 1); }
};

// llama-3-8b, llama-3-70b, mixtral-8x7b, tiny (a few MB, for tests), custom (defaults above).
Result<SynthShape> named_shape(std::string_view name);
std::vector<std::string> shape_names();
// Checks divisibility and sane bounds; the message names the offending option.
Status validate(const SynthShape& s);

// Type mix: "q4_k_m" (Q4_K; Q6_K for output and, in about half of the layers, attn_v and
// ffn_down, as llama.cpp's Q4_K_M), "q6_k", "q8_0", "f16", or any
// single format name known to quant. Norms, biases, rope_freqs and the MoE router stay F32. A
// tensor whose row length is not a multiple of the chosen format's block falls back to Q8_0,
// then F16.
struct TypeMix {
  std::string name;
  quant::Type base;
  bool k_m = false;  // q4_k_m's Q6_K promotions
};
Result<TypeMix> parse_type_mix(std::string_view name);

// How a tensor's values are generated.
enum class TensorKind { kMatrix, kNorm, kBias, kRopeFreqs };
struct SynthTensor {
  std::string name;
  quant::Type type;
  std::vector<uint64_t> shape;  // ne[0] first
  TensorKind kind;
  float scale;                  // std of matrix entries / noise of norms and biases
};

// The full tensor list and metadata for a shape and type mix (no weights yet).
struct SynthPlan {
  std::vector<gguf::KeyValue> metadata;
  std::vector<SynthTensor> tensors;
  uint32_t fallbacks = 0;  // tensors whose type fell back (row not a multiple of the block)
};
Result<SynthPlan> make_plan(const SynthShape& shape, const TypeMix& mix, uint64_t seed);

// The tokenizer section: GPT-2 byte-level tokens, merged tokens, special tokens up to `vocab`.
void add_tokenizer(std::vector<gguf::KeyValue>& kv, uint32_t vocab, const std::string& pre, uint64_t seed);

struct SynthStats {
  uint64_t bytes = 0;
  double seconds = 0;
  size_t tensors = 0;
};
// Writes the plan to `path` with `threads` generator threads (0: hardware concurrency).
Status write_synth(const SynthPlan& plan, const std::string& path, uint64_t seed, unsigned threads,
                   SynthStats* stats);

}  // namespace sluice::app
