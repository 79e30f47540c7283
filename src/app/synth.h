// `sluice synth`: writes a random-but-valid GGUF of a named or custom shape, so streaming and
// throughput can be exercised at 8B/70B/MoE scale without downloading weights. The file is
// llama.cpp-compatible: complete hyper-parameters, a byte-level BPE tokenizer section, and weights
// whose scale (~1/sqrt(fan_in), norms ~1) keeps activations finite through many layers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/progress.h"
#include "core/status.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

namespace sluice::app {

struct SynthShape {
  std::string name = "custom";
  // llama (mixtral with experts) | qwen2 (q/k/v biases; qwen2moe with experts, which adds a
  // shared expert) | qwen3 (q/k norms; qwen3moe with experts) | gemma3 (q/k norms, post-attention
  // and post-FFN norms, GeGLU, sliding-window layers; dense only)
  std::string arch = "llama";
  uint32_t layers = 2;
  uint32_t dim = 256;
  uint32_t ffn = 512;          // per expert for MoE
  uint32_t heads = 4;
  uint32_t kv_heads = 2;
  uint32_t head_dim = 0;       // 0: dim / heads
  uint32_t vocab = 1024;
  uint32_t experts = 0;        // 0: dense
  uint32_t experts_used = 0;
  uint32_t shared_ffn = 0;     // qwen2moe's shared expert (required there, rejected elsewhere)
  uint32_t ctx = 4096;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  bool rope_scaling = false;   // llama-3.1 style: rope_freqs.weight (factor 8, 8192 original ctx)
  bool tied_output = false;    // no output.weight (uses token_embd)
  // gemma3: <arch>.attention.sliding_window (0: none, every layer global) and the period of
  // sliding_window_pattern (every period-th layer global); local layers rotate with RoPE base
  // 10000 (rope.freq_base_swa), global ones with rope_theta.
  uint32_t sliding_window = 0;
  uint32_t swa_period = 6;
  // MoE: Zipf exponent S of expert popularity (0: the unbiased random router). See RouteSkew.
  float route_skew = 0.0f;

  uint32_t n_embd_head() const { return head_dim ? head_dim : dim / (heads ? heads : 1); }
};

// llama-3-8b, llama-3-70b, mixtral-8x7b, qwen3-30b-a3b, qwen3-235b-a22b, qwen2moe-a2.7b,
// tiny (a few MB, for tests), custom (defaults above).
Result<SynthShape> named_shape(std::string_view name);
std::vector<std::string> shape_names();
// Checks divisibility and sane bounds; the message names the offending option.
Status validate(const SynthShape& s);

// Type mix: "q4_k_m" (Q4_K; Q6_K for output and, in about half of the layers, attn_v and
// ffn_down*, as llama.cpp's Q4_K_M; with 8 experts attn_v and attn_k Q8_0 and attn_output Q5_K),
// "q6_k", "q8_0", "f16", or any single format name known to quant. Norms, biases, rope_freqs and
// the MoE routers stay F32. A tensor whose row length is not a multiple of the chosen format's
// block falls back as llama.cpp's quantizer does (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0,
// Q2_K/Q3_K -> Q4_0), then to F16.
struct TypeMix {
  std::string name;
  quant::Type base;
  bool k_m = false;  // q4_k_m's Q6_K promotions
  // token_embd.weight's format (--embd-type; with --tied-output also the output matrix), as
  // llama-quantize's --token-embedding-type; unset: the mix's choice. SmolLM2-135M-Instruct's
  // Q4_1 file has Q8_0 embeddings.
  std::optional<quant::Type> embd;
};
Result<TypeMix> parse_type_mix(std::string_view name);
// A weight format by name (case-insensitive), for the option `option` (named in the error).
Result<quant::Type> parse_weight_format(std::string_view name, std::string_view option);

// How a tensor's values are generated.
enum class TensorKind {
  kMatrix,     // pooled random blocks, std `scale`
  kNorm,       // 1 + noise
  kBias,       // noise
  kRopeFreqs,  // llama-3.1 rope scaling factors
  kRouter,     // ffn_gate_inp under route skew: computed rows (RouteSkew)
};
// What route skew changes in a tensor (RouteSkew); kNone without skew.
enum class Reserved {
  kNone,
  kZeroRows,   // outputs into the residual stream (attn_output, ffn_down*): rows of the reserved
               // dims are zero, so no layer writes them
  kEmbedRows,  // token_embd: each row's reserved dims hold the token's routing code
  kUnitGains,  // ffn_norm: gain exactly 1 on the reserved dims
};
struct SynthTensor {
  std::string name;
  quant::Type type;
  std::vector<uint64_t> shape;  // ne[0] first
  TensorKind kind;
  float scale;                  // std of matrix entries / noise of norms and biases
  Reserved reserved = Reserved::kNone;
  int layer = -1;               // kRouter: its layer (each layer has its own popularity order)
};

// Route skew (--route-skew S > 0): the fraction of top-k selections that go to the expert of
// popularity rank r is about r^-S (normalized), in every MoE layer, with a seeded permutation of
// which expert has which rank per layer.
//
// How: residual dims [0, dims) are reserved. token_embd holds, in those dims of every row, a
// constant (dim 0) and the token's own random code (the others); the rows of attn_output and
// ffn_down* that write those dims are zero, so no layer changes them and every layer's residual
// stream carries them unchanged. ffn_norm's gain there is exactly 1, and the router
// (ffn_gate_inp, F32) reads only those dims: a bias per expert on dim 0 (the log-popularity
// target, times 1/constant) plus random weights on the code dims (the token-to-token variation).
// The RMS norm scales a token's whole vector by one positive factor, and softmax followed by
// top-k selects the same experts from logits scaled by any positive factor, so the experts a
// token selects in a layer depend only on its token_embd row, at every position and depth: the
// writer fits the biases on up to 4096 of the file's own (quantized) rows, routed exactly as
// every layer will route them (llama.cpp's forward pass selects exactly these experts:
// tools/synth/llama_routes.cpp). What this does not model: routing that depends on context (here
// it depends on the token id alone). S = 0 keeps the original random router, which reads the
// whole residual stream; its popularity is not flat in a forward pass (attention adds a component
// shared by the tokens of a sequence).
struct RouteSkew {
  float exponent = 0;          // S; 0: off
  uint32_t dims = 0;           // reserved residual dims [0, dims)
  uint32_t experts = 0;
  uint32_t experts_used = 0;
};
inline constexpr uint32_t kRouteDims = 32;

// Fraction of a layer's top-k selections the expert of each popularity rank should get: r^-S
// normalized, with no expert above 1/k (it cannot be selected twice for one token); the excess
// of capped ranks goes to the others in proportion. Sums to 1.
std::vector<double> route_targets(uint32_t experts, uint32_t experts_used, double exponent);

// The full tensor list and metadata for a shape and type mix (no weights yet).
struct SynthPlan {
  std::vector<gguf::KeyValue> metadata;
  std::vector<SynthTensor> tensors;
  uint32_t fallbacks = 0;  // tensors whose type fell back (row not a multiple of the block)
  RouteSkew skew;
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
// on_progress (optional) receives (bytes written so far, file bytes) as tensor data is produced.
Status write_synth(const SynthPlan& plan, const std::string& path, uint64_t seed, unsigned threads,
                   SynthStats* stats, const core::ProgressFn& on_progress = {});

}  // namespace sluice::app
