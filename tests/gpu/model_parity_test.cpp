// Whole-model parity of the CUDA backend against the CPU backend: the residual stream after every
// layer (prefill through the GEMM path, decode through the GEMV path), first-position logits, and
// greedy tokens, on synthetic models of every architecture and weight format mix and on a real
// model when one is present.
//
// Why the bounds are what they are (measured on an H100, 2026-11-22; see docs/CUDA.md):
// - The backends quantize activations differently. The CPU multiplies quantized weights by int8
//   activations (32-element blocks for the legacy formats, 256-element Q8_K blocks for K-quants),
//   as llama.cpp's CPU backend does; the GPU decodes with int8 activations in 32-element blocks and
//   prefills with f16 activations on tensor cores. Each of these is ~0.5% relative noise per matrix
//   input, and random-weight models amplify it layer by layer: quantized synthetic models differ
//   by up to 5e-2 in hidden states (bound 8e-2), float-format models by 1e-3..6e-3 (bound 1e-2),
//   the real (depth-truncated) SmolLM2 by 1e-2, with a seed-dependent tail to 3.2e-2 (bound 5e-2). A wrong op (mask, rope, GQA head,
//   block index) shows as an error of order 1, far above every bound.
// - Greedy tokens: the GPU continuation is fed back to the CPU (teacher forcing) and the argmax
//   compared at every position; where they differ, the CPU's own top-2 gap there must be a
//   near-tie (below 3% of the logit spread), else the test fails; at least 80% must agree.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "app/synth.h"
#include "backend/backend.h"
#include "gpu_util.h"
#include "model/config.h"
#include "model/model.h"
#include "quant/quant.h"
#include "stream/expert_streamer.h"

namespace sluice::test::gpu {
namespace {

struct Case {
  std::string name;
  std::string arch;
  std::string mix;
  uint32_t dim, heads, kv_heads, head_dim, ffn, layers;
  bool rope_scaling = false;
  bool tied = false;
  uint32_t experts = 0, experts_used = 0;  // mixture of experts (ffn = per expert)
  uint32_t sliding_window = 0;  // gemma3: local layers' window (every third layer global)
};

std::string synth_model(const Case& c) {
  app::SynthShape s;
  s.arch = c.arch;
  s.dim = c.dim;
  s.heads = c.heads;
  s.kv_heads = c.kv_heads;
  s.head_dim = c.head_dim;
  s.ffn = c.ffn;
  s.layers = c.layers;
  s.vocab = 2048;
  s.ctx = 4096;
  s.rope_scaling = c.rope_scaling;
  s.tied_output = c.tied;
  s.experts = c.experts;
  s.experts_used = c.experts_used;
  s.sliding_window = c.sliding_window;
  s.swa_period = 3;
  if (c.arch == "gemma3") s.rope_theta = 1e6f;  // global layers; local ones use 10000
  EXPECT_TRUE(app::validate(s).is_ok());
  auto mix = app::parse_type_mix(c.mix);
  EXPECT_TRUE(mix.is_ok()) << c.mix;
  auto plan = app::make_plan(s, *mix, 7);
  EXPECT_TRUE(plan.is_ok()) << plan.status().message();
  const std::string path = (std::filesystem::temp_directory_path() / ("sluice_gpu_parity_" + c.name + ".gguf")).string();
  const Status st = app::write_synth(*plan, path, 7, 4, nullptr);
  EXPECT_TRUE(st.is_ok()) << st.message();
  return path;
}

struct Trace {
  std::vector<std::vector<float>> layers;  // hidden after each layer
  std::vector<float> logits;               // last token
};

Trace run_traced(const std::string& path, model::BackendKind kind, const std::vector<int32_t>& prefix,
                 int32_t next) {
  Trace tr;
  model::LoadOptions lo;
  lo.backend = kind;
  lo.n_ctx = 512;
  lo.on_layer = [&](int, std::span<const float> h) { tr.layers.emplace_back(h.begin(), h.end()); };
  auto m = model::Model::load(path, lo);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  if (!m.is_ok()) return tr;
  std::vector<float> logits(static_cast<size_t>((*m)->n_vocab()));
  EXPECT_TRUE((*m)->eval(prefix, logits).is_ok());
  const int32_t one[] = {next};
  EXPECT_TRUE((*m)->eval(one, logits).is_ok());
  tr.logits = logits;
  return tr;
}

std::vector<int32_t> prompt_ids(int n, int vocab, uint64_t salt) {
  std::mt19937_64 rng(test_seed() ^ salt);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = int32_t(rng() % uint64_t(vocab));
  return ids;
}

int argmax(const float* v, int n) { return int(std::max_element(v, v + n) - v); }

// What check_parity holds the CUDA backend to, against the CPU backend.
struct Bounds {
  double tol;               // normalized error of every layer's hidden states (prefill, decode)
  int n_gen;                // greedy tokens
  double near_tie = 0.03;   // a greedy disagreement within this fraction of the logit spread is a near-tie
  int router_flips = 0;     // mixtures of experts: decode jumps and greedy disagreements beyond the near-tie bound
  int prefill_flips = 0;    // mixtures of experts: prefill positions whose error may jump (router near-ties)
  double logits_tol = 0;    // the traced token's logits, and 2x this for every greedy step (0: tol)
  double min_agree = 0.8;   // fraction of greedy positions where the argmaxes agree
};

// Hidden states per layer (prefill 37 tokens, then one decode token), then greedy continuation.
void check_parity(const std::string& path, const Bounds& bd) {
  const double tol = bd.tol, near_tie = bd.near_tie, logits_tol = bd.logits_tol > 0 ? bd.logits_tol : bd.tol;
  const int n_gen = bd.n_gen, router_flips = bd.router_flips;
  int n_vocab = 0, n_layer = 0;
  int64_t n_embd = 0;
  {
    auto probe = model::Model::load(path, {});
    ASSERT_TRUE(probe.is_ok()) << probe.status().message();
    n_vocab = (*probe)->n_vocab();
    n_layer = (*probe)->config().n_layer;
    n_embd = (*probe)->config().n_embd;
  }

  const auto prefix = prompt_ids(37, n_vocab, 11);
  const int32_t next = prompt_ids(1, n_vocab, 12)[0];
  const Trace cpu = run_traced(path, model::BackendKind::kCpu, prefix, next);
  const Trace gpu = run_traced(path, model::BackendKind::kCuda, prefix, next);
  ASSERT_EQ(cpu.layers.size(), size_t(2 * n_layer));
  ASSERT_EQ(gpu.layers.size(), size_t(2 * n_layer));
  double worst_prefill = 0, worst_decode = 0;
  // Mixtures of experts: at the one traced decode token a router near-tie may pick another expert
  // on one backend (seen once: mixtral F16, a fresh seed, H200 2026-11-28; six fixed seeds at
  // 6.6e-4..7.9e-4). That layer's error jumps from within the bound to far above it, and every later
  // layer and the logits inherit it; in a case that allows router flips, one such jump ends the
  // decode check.
  // The same holds for each of the 37 prefill positions, and there it is common: a flip moves one
  // position's hidden state to 0.08..0.43, which alone puts a layer's error over all 37 positions
  // near 0.08 (qwen3moe Q8_0 failed the whole-layer bound at 5 of 34 seeds, H200, 2026-11-28,
  // 0.080..0.095 against 0.08; per position, 2..9 of the 37 jumped, from 0.01..0.02, at layers 0
  // and 1). So a position whose own error jumps from within the bound to above it leaves the
  // prefill check from that layer on (at most bd.prefill_flips positions), and the other positions
  // are held to the bound together.
  int decode_diverged_at = -1;
  double prev_e2 = 0;
  const int np = 37;
  std::vector<double> prev_pos(size_t(np), 0.0);
  std::vector<bool> pos_flipped(size_t(np), false);
  int prefill_flips = 0;
  for (int l = 0; l < n_layer; ++l) {
    const auto& a = cpu.layers[size_t(l)];
    const auto& b = gpu.layers[size_t(l)];
    ASSERT_EQ(a.size(), size_t(np * n_embd));
    ASSERT_EQ(b.size(), a.size());
    SquaredNorms kept;  // the positions still checked
    for (int p = 0; p < np; ++p) {
      if (pos_flipped[size_t(p)]) continue;
      const size_t off = size_t(p) * size_t(n_embd);
      const SquaredNorms ps = squared_norms(b.data() + off, a.data() + off, size_t(n_embd));
      const double ep = ps.ratio();
      if (bd.prefill_flips > 0 && ep > tol && prev_pos[size_t(p)] <= tol) {
        pos_flipped[size_t(p)] = true;
        ++prefill_flips;
        std::printf("  prefill: position %d, layer %d jumps to %.2e (layer before %.2e): a router near-tie, "
                    "later layers not checked there\n", p, l, ep, prev_pos[size_t(p)]);
        continue;
      }
      prev_pos[size_t(p)] = ep;
      kept.num += ps.num;
      kept.den += ps.den;
    }
    const double e = kept.ratio();
    worst_prefill = std::max(worst_prefill, e);
    EXPECT_LE(e, tol) << "prefill, layer " << l;
    const auto& c = cpu.layers[size_t(n_layer + l)];
    const auto& d = gpu.layers[size_t(n_layer + l)];
    ASSERT_EQ(c.size(), size_t(n_embd));
    const double e2 = normalized_error(d.data(), c.data(), c.size());
    if (decode_diverged_at >= 0) continue;
    if (e2 > tol && prev_e2 <= tol && router_flips > 0) {
      decode_diverged_at = l;
      std::printf("  decode: layer %d jumps to %.2e (layer before %.2e): a router near-tie, later layers not checked\n",
                  l, e2, prev_e2);
      continue;
    }
    prev_e2 = e2;
    worst_decode = std::max(worst_decode, e2);
    // Decode inherits the prefill's KV-cache differences: same bound.
    EXPECT_LE(e2, tol) << "decode, layer " << l;
  }
  EXPECT_LE(prefill_flips, bd.prefill_flips) << "prefill positions with a jump";
  const double le = normalized_error(gpu.logits.data(), cpu.logits.data(), cpu.logits.size());
  if (decode_diverged_at < 0) {
    EXPECT_LE(le, logits_tol) << "logits";
  }
  const bool top1 = argmax(gpu.logits.data(), n_vocab) == argmax(cpu.logits.data(), n_vocab);
  std::printf("  hidden: worst prefill %.2e, decode %.2e; logits %.2e, top-1 %s\n", worst_prefill, worst_decode, le,
              top1 ? "agrees" : "differs");

  // Greedy on the GPU (graphs on), teacher-forced on the CPU.
  model::LoadOptions lg;
  lg.backend = model::BackendKind::kCuda;
  lg.cuda_graphs = true;  // the replayed-step path (the default)
  lg.n_ctx = 512;
  auto g = model::Model::load(path, lg);
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  std::vector<float> logits(static_cast<size_t>(n_vocab));
  ASSERT_TRUE((*g)->eval(prefix, logits).is_ok());
  std::vector<int32_t> seq = prefix;
  std::vector<std::vector<float>> gpu_steps;  // the GPU's logits before each greedy token
  for (int i = 0; i < n_gen; ++i) {
    const int32_t t = argmax(logits.data(), n_vocab);
    gpu_steps.push_back(logits);
    seq.push_back(t);
    const int32_t one[] = {t};
    ASSERT_TRUE((*g)->eval(one, logits).is_ok());
  }
  model::LoadOptions lc;
  lc.backend = model::BackendKind::kCpu;
  lc.n_ctx = 512;
  auto c = model::Model::load(path, lc);
  ASSERT_TRUE(c.is_ok());
  std::vector<float> all(seq.size() * size_t(n_vocab));
  ASSERT_TRUE((*c)->eval(seq, all).is_ok());
  // Every step's logits, GPU against the CPU at the same tokens: within twice the traced token's
  // bound (8 seeds of every synthetic case, H200, 2026-11-28: dense quantized at most 5.9e-2 against
  // 0.16, float 9.3e-3 against 2e-2). Dense models only: in a mixture of experts a router flip moves
  // a step by far more (qwen3moe Q8_0: up to 0.41), and flips are as common at decode steps as at
  // prefill positions (above).
  int agree = 0, beyond = 0, steps_beyond = 0;
  double worst_gap = 0, worst_step = 0;
  for (size_t p = prefix.size() - 1; p + 1 < seq.size(); ++p) {
    const float* row = all.data() + p * size_t(n_vocab);
    const double se = normalized_error(gpu_steps[p + 1 - prefix.size()].data(), row, size_t(n_vocab));
    worst_step = std::max(worst_step, se);
    if (se > 2 * logits_tol) {
      ++steps_beyond;
      std::printf("  greedy: position %zu: logits error %.2e\n", p, se);
    }
    const int want = argmax(row, n_vocab);
    if (want == seq[p + 1]) {
      ++agree;
      continue;
    }
    // Near-tie: the GPU's pick scores within `near_tie` of the logit spread of the CPU's best.
    const auto [lo, hi] = std::minmax_element(row, row + n_vocab);
    const double gap = double(row[want] - row[seq[p + 1]]) / double(*hi - *lo);
    worst_gap = std::max(worst_gap, gap);
    if (gap > near_tie) {
      ++beyond;
      std::printf("  greedy: position %zu: GPU chose %d, CPU %d, gap %.3f of the spread\n", p, seq[p + 1], want, gap);
    }
  }
  EXPECT_LE(beyond, router_flips) << "disagreements beyond the near-tie bound " << near_tie;
  if (router_flips == 0) {
    EXPECT_EQ(steps_beyond, 0) << "greedy steps whose logits differ by more than " << 2 * logits_tol;
  }
  std::printf("  greedy: %d/%d positions agree; worst relative gap at a disagreement %.3f; worst logits error of a "
              "step %.2e\n", agree, n_gen, worst_gap, worst_step);
  EXPECT_GE(agree, int(bd.min_agree * n_gen)) << "greedy positions that agree";
}

// The model on the CUDA backend, its decode steps replayed (graphs) or launched kernel by kernel.
Result<std::unique_ptr<model::Model>> load_cuda(const std::string& path, bool graphs, int n_ctx) {
  model::LoadOptions lo;
  lo.backend = model::BackendKind::kCuda;
  lo.cuda_graphs = graphs;
  lo.n_ctx = n_ctx;
  return model::Model::load(path, lo);
}

// A decode step recorded once and replayed (graphs, the default) gives the logits of the same
// step issued kernel by kernel, bit for bit, at every position: across the 256-position buckets
// where the step is re-recorded with a new attention plan, with Q/K norms (qwen3) and GQA; and for
// gemma3 with a 100-position sliding window, whose start the replayed kernels derive from the
// position in device memory (it moves every token, inside and across buckets).
TEST(CudaGraphs, ReplayedStepsEqualDirectLaunches) {
  SLUICE_SKIP_WITHOUT_GPU();
  for (const Case& c : {Case{"graphs_qwen3", "qwen3", "q4_k_m", 512, 8, 2, 64, 1024, 2},
                        Case{"graphs_gemma3", "gemma3", "q4_k_m", 512, 4, 1, 128, 1024, 3, false, true, 0, 0, 100}}) {
    SCOPED_TRACE(c.name);
    const std::string path = synth_model(c);
    auto g = load_cuda(path, true, 700), d = load_cuda(path, false, 700);
    ASSERT_TRUE(g.is_ok() && d.is_ok());
    const int n_vocab = (*g)->n_vocab();
    const auto prefix = prompt_ids(37, n_vocab, 21);
    std::vector<float> lg(static_cast<size_t>(n_vocab)), ld(lg.size());
    ASSERT_TRUE((*g)->eval(prefix, lg).is_ok());
    ASSERT_TRUE((*d)->eval(prefix, ld).is_ok());
    int mismatched = 0, first_bad = -1;
    const int steps = 600;  // positions 37 .. 636: buckets 0, 1 and 2
    for (int i = 0; i < steps; ++i) {
      const int32_t one[] = {argmax(lg.data(), n_vocab)};
      ASSERT_TRUE((*g)->eval(one, lg).is_ok());
      ASSERT_TRUE((*d)->eval(one, ld).is_ok());
      if (std::memcmp(lg.data(), ld.data(), lg.size() * sizeof(float)) != 0) {
        ++mismatched;
        if (first_bad < 0) first_bad = 37 + i;
      }
    }
    EXPECT_EQ(mismatched, 0) << "first at position " << first_bad;
    std::filesystem::remove(path);
  }
}

// A layer mask (--skip-layers, a self-draft's draft passes) is a replayed step of its own: with
// graphs, every token under a mask equals the directly launched pass under the same mask, bit for
// bit, across mask changes (a mask, none, the same mask again, another mask). A step replayed
// under the wrong key would run the other mask's layers and differ.
TEST(CudaGraphs, MaskedStepsEqualDirectLaunches) {
  SLUICE_SKIP_WITHOUT_GPU();
  const Case c{"graphs_mask_gemma3", "gemma3", "q4_k_m", 512, 4, 1, 128, 1024, 3, false, true, 0, 0, 100};
  const std::string path = synth_model(c);
  auto g = load_cuda(path, true, 512), d = load_cuda(path, false, 512);
  ASSERT_TRUE(g.is_ok() && d.is_ok());
  const int n_vocab = (*g)->n_vocab(), n_layer = (*g)->config().n_layer;
  ASSERT_GE(n_layer, 3);
  std::vector<bool> skip1(size_t(n_layer), true), skip0(size_t(n_layer), true);
  skip1[1] = false;
  skip0[0] = false;
  const auto prefix = prompt_ids(21, n_vocab, 31);
  std::vector<float> lg(static_cast<size_t>(n_vocab)), ld(lg.size());
  ASSERT_TRUE((*g)->eval(prefix, lg).is_ok());
  ASSERT_TRUE((*d)->eval(prefix, ld).is_ok());
  const std::vector<std::vector<bool>> phases = {skip1, {}, skip1, skip0};
  for (size_t ph = 0; ph < phases.size(); ++ph) {
    SCOPED_TRACE("phase " + std::to_string(ph));
    ASSERT_TRUE((*g)->set_layer_mask(phases[ph]).is_ok());
    ASSERT_TRUE((*d)->set_layer_mask(phases[ph]).is_ok());
    int mismatched = 0;
    for (int i = 0; i < 40; ++i) {
      const int32_t one[] = {argmax(lg.data(), n_vocab)};
      ASSERT_TRUE((*g)->eval(one, lg).is_ok());
      ASSERT_TRUE((*d)->eval(one, ld).is_ok());
      mismatched += std::memcmp(lg.data(), ld.data(), lg.size() * sizeof(float)) != 0;
    }
    EXPECT_EQ(mismatched, 0);
  }
  std::filesystem::remove(path);
}

const std::vector<Case>& cases() {
  static const std::vector<Case> kCases = {  // immutable
      {"llama_q4km_ropescale", "llama", "q4_k_m", 512, 8, 2, 0, 1408, 4, true, false},
      {"llama_q6k", "llama", "q6_k", 512, 8, 2, 0, 1408, 3},
      {"llama_q8_0", "llama", "q8_0", 512, 8, 8, 0, 1024, 3},
      {"llama_f16_tied", "llama", "f16", 512, 8, 4, 0, 1024, 3, false, true},
      {"qwen2_q4km", "qwen2", "q4_k_m", 512, 4, 2, 128, 1024, 3},
      {"qwen3_q6k", "qwen3", "q6_k", 512, 4, 1, 128, 1024, 3},
      // Rows of 2048 columns: every Q6_K matrix is uploaded in the grouped layout (backend/cuda/layout.h).
      {"llama_q6k_grouped", "llama", "q6_k", 2048, 16, 4, 0, 2048, 2},
      {"llama_q4_0", "llama", "q4_0", 256, 4, 2, 0, 512, 2},
      {"llama_q4_1", "llama", "q4_1", 256, 4, 2, 0, 512, 2},
      {"llama_q5_0", "llama", "q5_0", 256, 4, 2, 0, 512, 2},
      {"llama_q5_1", "llama", "q5_1", 256, 4, 2, 0, 512, 2},
      {"llama_q2_k", "llama", "q2_k", 256, 4, 2, 0, 512, 2},
      {"llama_q3_k", "llama", "q3_k", 256, 4, 2, 0, 512, 2},
      {"llama_q5_k", "llama", "q5_k", 256, 4, 2, 0, 512, 2},
      {"llama_bf16", "llama", "bf16", 256, 4, 2, 0, 512, 2},
      {"llama_f32", "llama", "f32", 256, 4, 2, 0, 512, 2},
      // Mixtures of experts: routing is decided on the host from each backend's router logits, so
      // a near-tie may pick another expert on one backend. A q4_k_m Mixtral of random weights
      // flips greedy tokens at CPU top-2 gaps up to 0.14 that way (H100, 2026-11-25), above this
      // test's near-tie bound, so the quantized MoE case here is Q8_0.
      {"mixtral_f16", "llama", "f16", 512, 8, 2, 0, 512, 2, false, false, 8, 2},
      {"qwen3moe_q8_0", "qwen3", "q8_0", 512, 4, 2, 128, 256, 2, false, false, 16, 4},
      // Gemma 3 (GeGLU, embedding scaling, post norms, QK-norm): Gemma 3 270M's attention shape
      // (4 heads of 256, one KV head, q 1024 wide on a 640 residual) with a 16-token window, so the
      // 37-token prefill and the decode token both pass it in layers 0, 1 and 3 (layer 2 global).
      {"gemma3_q4km_swa", "gemma3", "q4_k_m", 640, 4, 1, 256, 2048, 4, false, true, 0, 0, 16},
      {"gemma3_f16_swa", "gemma3", "f16", 256, 4, 1, 64, 512, 3, false, true, 0, 0, 8},
  };
  return kCases;
}

class ModelParity : public ::testing::TestWithParam<Case> {};

TEST_P(ModelParity, HiddenStatesLogitsAndGreedyMatchCpu) {
  SLUICE_SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const std::string path = synth_model(c);
  const bool float_format = c.mix == "f16" || c.mix == "f32" || c.mix == "bf16";
  // Quantized mixtures of experts: a router near-tie upstream switches an expert on one backend and
  // moves the logits further than the attention noise does (qwen3moe Q8_0: a flip at a 3.3% gap,
  // H100 2026-11-25), so their greedy near-tie bound is 10% of the spread.
  const bool quantized_moe = c.experts > 0 && !float_format;
  // Routing is discontinuous: where a router's k-th and (k+1)-th experts nearly tie, the backends'
  // rounding picks different experts and that token's logits move by far more than any near-tie
  // bound (mixtral F16: a flip at 0.26 of the spread, H100 2026-11-25, fresh seed; hidden states
  // and logits at the traced positions matched). One such position is allowed per MoE case.
  // Random weights give flat logits, where near-ties are common and a greedy run that falls into a
  // repetition loop meets the same one again and again. Over 34 seeds (H200, 2026-11-28) the
  // quantized dense cases agreed at 24..32 of 32 positions, every disagreement a near-tie of at most
  // 0.031 of the spread (Q3_K; the others at most 0.016): the old bounds (25 positions, 0.03) failed
  // at 2 seeds. The per-step logits bound above checks the numbers themselves at every step.
  Bounds bd{float_format ? 1e-2 : 8e-2, 32};
  bd.near_tie = quantized_moe ? 0.1 : float_format ? 0.03 : 0.05;
  bd.router_flips = c.experts > 0 ? 1 : 0;
  bd.prefill_flips = quantized_moe ? 37 / 3 : c.experts > 0 ? 2 : 0;
  bd.min_agree = float_format ? 0.8 : 0.625;
  check_parity(path, bd);
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Synthetic, ModelParity, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// Expert placement on the GPU (stream/expert_streamer.h): a cache of 6 of the 16 experts, misses on
// the CPU, copied, or either by the cost model, against the same model resident on the GPU, both
// fed the resident run's greedy tokens. The host computes some experts (F16 weights: CPU and GPU
// agree to ~1e-3), so a router near-tie may pick another expert at a step: at most 2 of the 17
// steps may exceed the float bound 1e-2 (a wrong slot, copy order or hand-off breaks them all).
TEST(ExpertPlacementGpu, MatchesResident) {
  SLUICE_SKIP_WITHOUT_GPU();
  const Case c{"mixtral_place", "llama", "f16", 512, 8, 2, 0, 512, 2, false, false, 8, 2};
  const std::string path = synth_model(c);
  std::vector<int32_t> tokens;  // the resident run's greedy continuation
  stream::ExpertStreamer* es = nullptr;  // the placed run's streamer, alive while its model is
  stream::ExpertStats stats;
  std::string line;
  int slots = 0;
  auto run = [&](std::function<Result<std::unique_ptr<model::LayerSource>>(const gguf::File&, const model::Weights&,
                                                                            backend::Backend&)> src) {
    model::LoadOptions lo;
    lo.backend = model::BackendKind::kCuda;
    lo.n_ctx = 256;
    lo.layer_source = std::move(src);
    auto m = model::Model::load(path, lo);
    EXPECT_TRUE(m.is_ok()) << m.status().message();
    std::vector<std::vector<float>> out;
    if (!m.is_ok()) return out;
    std::vector<float> logits(size_t((*m)->n_vocab()));
    const auto prompt = prompt_ids(40, (*m)->n_vocab(), 21);
    EXPECT_TRUE((*m)->eval(prompt, logits).is_ok());
    out.push_back(logits);
    const bool first = tokens.empty();
    for (int i = 0; i < 16; ++i) {
      if (first) tokens.push_back(argmax(logits.data(), int(logits.size())));
      EXPECT_TRUE((*m)->eval(std::span<const int32_t>(&tokens[size_t(i)], 1), logits).is_ok());
      out.push_back(logits);
    }
    if (es) stats = es->stats(), line = es->stats_line(), slots = es->cache_slots();
    return out;
  };
  const auto want = run(nullptr);
  for (const stream::MissPolicy policy : {stream::MissPolicy::kCostModel, stream::MissPolicy::kCpu,
                                          stream::MissPolicy::kCopy}) {
    SCOPED_TRACE(int(policy));
    stream::ExpertStreamOptions eo;
    eo.policy = policy;
    eo.n_ctx = 256;
    // Six slots: one expert's three F16 [512, 512] matrices each.
    eo.cache_bytes = 6 * 3 * uint64_t(quant::row_bytes(quant::Type::kF16, 512)) * 512;
    const auto got = run(stream::expert_streaming_source(eo, &es));
    es = nullptr;
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(slots, 6);
    int over = 0;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double err = normalized_error(got[i].data(), want[i].data(), want[i].size());
      over += err > 1e-2;
      worst = std::max(worst, err);
    }
    std::printf("[placement] policy %d: %d of %zu steps above 1e-2 (worst %.3g); %s\n", int(policy), over, got.size(),
                worst, line.c_str());
    EXPECT_LE(over, 2);
    const stream::ExpertStats& st = stats;
    EXPECT_EQ(st.uses, st.hits + st.cpu_misses + st.copy_misses);
    if (policy == stream::MissPolicy::kCpu) {
      EXPECT_GT(st.cpu_misses, 0u);
    }
    if (policy == stream::MissPolicy::kCopy) {
      EXPECT_GT(st.copy_misses, 0u);
    }
  }
  std::filesystem::remove(path);
}

// Several sequences in one pass over the paged KV cache (Model::eval_batch) on CUDA: three
// sequences whose blocks are scattered through the pool (a filler sequence is freed between
// them), prompt chunks of several sequences together, chunks mixed with decode tokens, then one
// token of each per pass; every returned row compared with the sequence evaluated alone. Batched
// rows take other kernels (GEMM with f16 activations vs GEMV with int8 ones) than the lone run,
// so the bound is the quantized parity bound; a wrong row map, position or window shows as an
// error of order 1. Also gemma3 (sliding window 8 across block boundaries) and qwen3 (QK-norm).
TEST(BatchedSequencesGpu, MatchEachAlone) {
  SLUICE_SKIP_WITHOUT_GPU();
  for (const Case& c : {Case{"batch_qwen3", "qwen3", "q4_k_m", 512, 8, 2, 64, 1024, 2},
                        Case{"batch_gemma3", "gemma3", "q4_k_m", 512, 4, 1, 128, 1024, 3, false, true, 0, 0, 8}}) {
    SCOPED_TRACE(c.name);
    const std::string path = synth_model(c);
    const std::vector<std::vector<int32_t>> texts = {prompt_ids(40, 2048, 21), prompt_ids(29, 2048, 22),
                                                     prompt_ids(55, 2048, 23)};
    model::LoadOptions lo;
    lo.backend = model::BackendKind::kCuda;
    lo.n_ctx = 256;
    auto solo = model::Model::load(path, lo);
    ASSERT_TRUE(solo.is_ok()) << solo.status().message();
    const size_t nv = size_t((*solo)->n_vocab());
    std::vector<std::vector<float>> ref;
    for (const auto& t : texts) {
      (*solo)->truncate(0);
      ref.emplace_back(t.size() * nv);
      ASSERT_TRUE((*solo)->eval(t, ref.back()).is_ok());
    }
    lo.max_sequences = 5;
    lo.kv_positions = 16 * 16;
    auto m = model::Model::load(path, lo);
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    model::Model& mm = **m;
    std::vector<float> one(nv);
    auto filler = mm.seq_new();
    ASSERT_TRUE(filler.is_ok());
    const std::vector<int32_t> fill(40, 3);
    ASSERT_TRUE(mm.eval_batch(std::vector<model::Model::SeqTokens>{{*filler, fill, false}}, one).is_ok());
    std::vector<int> seq;
    for (size_t i = 0; i < texts.size(); ++i) seq.push_back(*mm.seq_new());
    ASSERT_TRUE(mm.eval_batch(std::vector<model::Model::SeqTokens>{{seq[0], std::span(texts[0]).first(5), false}}, one)
                    .is_ok());
    mm.seq_free(*filler);
    std::vector<size_t> done = {5, 0, 0};
    double worst = 0;
    auto step = [&](const std::vector<std::pair<size_t, size_t>>& what, bool all) {
      std::vector<model::Model::SeqTokens> items;
      size_t rows = 0;
      for (auto [i, n] : what) {
        items.push_back({seq[i], std::span(texts[i]).subspan(done[i], n), all});
        rows += all ? n : 1;
      }
      std::vector<float> out(rows * nv);
      const Status st = mm.eval_batch(items, out);
      ASSERT_TRUE(st.is_ok()) << st.message();
      size_t r = 0;
      for (auto [i, n] : what) {
        for (size_t t = all ? 0 : n - 1; t < n; ++t, ++r) {
          const size_t pos = done[i] + t;
          const float* want = ref[i].data() + pos * nv;
          const double e = normalized_error(out.data() + r * nv, want, nv);
          worst = std::max(worst, e);
          EXPECT_LE(e, 8e-2) << "text " << i << " position " << pos;
        }
        done[i] += n;
      }
    };
    step({{0, 20}, {1, 17}}, true);
    step({{2, 30}, {0, 1}, {1, 1}}, false);
    step({{1, 3}, {2, 9}, {0, 4}}, true);
    while (done[0] < texts[0].size() || done[1] < texts[1].size() || done[2] < texts[2].size()) {
      std::vector<std::pair<size_t, size_t>> what;
      for (size_t i = 0; i < 3; ++i)
        if (done[i] < texts[i].size()) what.push_back({i, 1});
      step(what, false);
    }
    std::printf("  batched rows vs each sequence alone: worst normalized error %.2e\n", worst);
    std::filesystem::remove(path);
  }
}

// The backend's scratch is allocated at load for the largest pass (Backend::reserve_scratch), so
// that the memory plans of stream/ can count it: passes of every kind (prefill through the GEMM,
// decode through the GEMV and recorded graphs, 3..32 rows through mmq, decode rows of several
// sequences, a prompt chunk among them) allocate nothing more, and the reservation is within what
// backend::cuda_scratch_bytes tells the plans.
TEST(CudaScratch, ReservedAtLoadAndCountedByThePlans) {
  SLUICE_SKIP_WITHOUT_GPU();
  const Case c{"scratch_qwen3", "qwen3", "q4_k_m", 512, 8, 2, 64, 1024, 2};
  const std::string path = synth_model(c);
  model::LoadOptions lo;
  lo.backend = model::BackendKind::kCuda;
  lo.n_ctx = 128;
  lo.max_batch = 64;
  lo.max_sequences = 4;
  lo.kv_positions = 16 * 16;
  auto m = model::Model::load(path, lo);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  model::Model& mm = **m;
  const int64_t at_load = mm.device_bytes();
  EXPECT_GT(at_load, 0);
  const size_t nv = size_t(mm.n_vocab());
  std::vector<float> out(64 * nv);
  const std::vector<int32_t> prompt = prompt_ids(64, 2048, 31);
  ASSERT_TRUE(mm.eval(prompt, std::span(out).first(nv)).is_ok());  // one 64-row pass: the GEMM path
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(mm.eval(std::span(prompt).subspan(size_t(i), 1), std::span(out).first(nv)).is_ok());
  ASSERT_TRUE(mm.eval(std::span(prompt).first(5), std::span(out).first(nv)).is_ok());   // mmq
  ASSERT_TRUE(mm.eval(std::span(prompt).first(2), std::span(out).first(nv)).is_ok());   // two-token GEMV
  std::vector<int> seqs;
  for (int i = 0; i < 3; ++i) {
    auto s = mm.seq_new();
    ASSERT_TRUE(s.is_ok()) << s.status().message();
    seqs.push_back(*s);
    ASSERT_TRUE(mm.eval_batch(std::vector<model::Model::SeqTokens>{{*s, std::span(prompt).first(size_t(9 + i)), false}},
                              std::span(out).first(nv))
                    .is_ok());
  }
  const int32_t one[] = {7};
  std::vector<model::Model::SeqTokens> decode;
  for (int s : seqs) decode.push_back({s, one, false});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(mm.eval_batch(decode, std::span(out).first(3 * nv)).is_ok());
  decode.push_back({0, std::span(prompt).first(30), false});  // a prompt chunk with the decode rows
  ASSERT_TRUE(mm.eval_batch(decode, std::span(out).first(4 * nv)).is_ok());
  EXPECT_EQ(mm.device_bytes(), at_load) << "a pass allocated device memory after load";

  // The reservation alone, on a fresh backend, against what the plans count.
  auto gpu = backend::make_cuda_backend({0, false});
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().message();
  for (const backend::ScratchShape& shape :
       {backend::ScratchShape{64, 1024, 8, 64, 256, 4}, backend::ScratchShape{512, 28672, 64, 128, 6144, 32},
        backend::ScratchShape{2048, 28672, 64, 128, 2048, 1}, backend::ScratchShape{1, 576, 9, 64, 4096, 1}}) {
    const int64_t before = (*gpu)->allocated_bytes();
    ASSERT_TRUE((*gpu)->reserve_scratch(shape).is_ok());
    const int64_t reserved = (*gpu)->allocated_bytes() - before;
    EXPECT_LE(uint64_t(reserved), backend::cuda_scratch_bytes(shape)) << shape.max_tokens << " x " << shape.max_cols;
    auto fresh = backend::make_cuda_backend({0, false});
    ASSERT_TRUE(fresh.is_ok());
    ASSERT_TRUE((*fresh)->reserve_scratch(shape).is_ok());
    const int64_t alone = (*fresh)->allocated_bytes();
    EXPECT_LE(uint64_t(alone), backend::cuda_scratch_bytes(shape));
    EXPECT_GE(uint64_t(alone) + (uint64_t(12) << 20), backend::cuda_scratch_bytes(shape)) << "the plans count far more";
  }
  std::filesystem::remove(path);
}

// A real model: SLUICE_GPU_REAL_MODEL names a GGUF (scripts/gpu-check.sh passes a depth-truncated
// SmolLM2 that fits a carried build), else models/ holds the default model.
TEST(ModelParityReal, SmolLM2) {
  SLUICE_SKIP_WITHOUT_GPU();
  const char* env = std::getenv("SLUICE_GPU_REAL_MODEL");
  const std::string path = env && *env ? std::string(env) : model_path(kSmolLM2);
  SLUICE_REQUIRE_MODEL(path);
  // Random prompt ids over the whole vocabulary: measured over 25 seeds (H100, 2026-11-25) the
  // worst prefill layer is 1.0e-2..1.2e-2 for most, with a tail up to 2.9e-2 and 3.2e-2.
  check_parity(path, Bounds{5e-2, 48});
}

// Gemma 3 270M Q4_K_M (scripts/fetch-models.sh; on the GPU machine scripts/gpu-real-models.sh
// carries it) when models/ holds it: 18 layers, window 512 (the 37-token prompt stays inside it;
// the synthetic cases above pass their windows). Gemma 3 amplifies last-bit differences about ten
// times more than SmolLM2 (llama.cpp's own flash-attention on/off noise on its logits is 0.5-1.8,
// SmolLM2's at most 0.18; tests/golden). First run (H200, 2026-11-27): worst hidden state 8.1e-2,
// logits 0.20, greedy 48/48. Against llama.cpp's fixture the CUDA backend is the closer of the two
// (first-position logit RMS 0.47, the AVX2 CPU backend 0.97), so the difference measured here is
// mostly the CPU's own, equally correct, summation order. Bounds: twice the first run's.
TEST(ModelParityReal, Gemma3_270M) {
  SLUICE_SKIP_WITHOUT_GPU();
  const std::string path = model_path(kGemma3);
  SLUICE_REQUIRE_MODEL(path);
  Bounds bd{0.16, 48};
  bd.logits_tol = 0.4;
  check_parity(path, bd);
}

TEST(CudaBackend, ErrorsAreClear) {
  SLUICE_SKIP_WITHOUT_GPU();
  auto bad = backend::make_cuda_backend({99, true});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("does not exist"), std::string::npos) << bad.status().message();
  auto bw = backend::cuda_copy_bandwidth(0);
  ASSERT_TRUE(bw.is_ok()) << bw.status().message();
  EXPECT_GT(*bw, 1e11);  // any CUDA GPU sluice supports copies faster than 100 GB/s
}

}  // namespace
}  // namespace sluice::test::gpu
