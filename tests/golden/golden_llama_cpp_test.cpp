// Whole-model parity with llama.cpp (the correctness oracle). Fixtures in tests/fixtures/golden
// were produced by tools/golden/make_fixtures.sh (llama.cpp built from the llama-cpp-python
// 0.3.36 source package, CPU backend, flash attention off). For each prompt they hold the prompt
// token ids, llama.cpp's 64 greedy tokens, at every generated position its top-8 ids and logits
// and top-2 gap, its full logits at the first generated position, and its own numerical noise:
// the largest logit difference over the top-8 ids between its two attention paths (flash
// attention on vs off), both correct, which differ only in summation order and rounding.
// Models: SmolLM2-135M Q4_1 as published; the same requantized by llama-quantize into Q4_K_M,
// Q5_K_M, Q6_K, Q8_0 and Q2_K (GoldenRequantized: the test writes each file itself with
// golden/llama_quantize.h and checks it is the fixture's, by sha256); synthetic models of the
// other architectures and formats (GoldenSynth, written by `sluice synth`).
//
// Pass criteria, checked at EVERY generated position by teacher forcing (our model is fed
// llama.cpp's tokens, so one early near-tie does not end the comparison). Let noise(p) be
// llama.cpp's own top-8 discrepancy at position p and tol = 2 x max_p noise(p) for the prompt:
// twice the largest disagreement of llama.cpp with itself, because an independent
// implementation differs in the summation order of every op, not only attention.
// - tokenizer: our ids for the prompt text equal llama.cpp's;
// - greedy token: our argmax equals llama.cpp's, except where llama.cpp's own top-2 gap is a
//   near-tie: below max(kNearTie, 2 x noise(p)) — there llama.cpp's two attention paths could
//   disagree with each other too; and agreement on at least kMinAgreement of all positions;
// - logits over llama.cpp's top-8 ids: max |delta| <= max(kMinLogitTol, tol);
// - first-position logits over the whole vocabulary: top-1 agrees, RMS |delta| <= tol / 2.
// The free-running greedy continuation is reported too: identical prefix length and, where it
// diverges, llama.cpp's top-2 gap at the first differing position next to the literal
// near-tie threshold (1e-2) and llama.cpp's own noise there. The first divergence must be a
// near-tie by the rule above (a gap below max(1e-2, 2 x noise)).
//
// The literal rule (every diverging free-running continuation first differs where
// llama.cpp's top-2 gap is below 1e-2) is enforced for every model except those named in
// literal_exemption() below, with the measured reason. SmolLM2-135M Q4_1 on an x86 CPU with
// AVX-512 follows llama.cpp's f32 operation order op for op (Q4_1 x Q8_1 dot, SwiGLU's and
// softmax's exp, attention's f16 dot orders, RoPE's FMAs; tools/golden/op_parity.cpp checks the
// kernels bit for bit), so its 8 continuations are identical. The noise-calibrated rule above
// stays for all: on SmolLM2, llama.cpp with flash attention on diverges from itself with it off
// in 6 of 8 prompts, at top-2 gaps up to 0.18, because this small model amplifies last-bit
// rounding differences to tenths of a logit.
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "app/commands.h"
#include "app/common.h"
#include "model/chat_template.h"
#include "golden/llama_quantize.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "quant/quant.h"
#include "test_util.h"

namespace sluice {
namespace {

constexpr float kNearTie = 1e-2f;
// Floor of the logit tolerance: activations are quantized to 8 bits the same way on both sides.
constexpr float kMinLogitTol = 0.05f;
constexpr double kMinAgreement = 0.95;

struct GoldenCase {
  std::string prompt;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> tokens;
  std::vector<float> gaps;
  std::vector<float> noise;                                // per position
  std::vector<std::vector<std::pair<int, float>>> top8;   // per position
  // CUDA fixtures: positions where llama.cpp's CPU backend, teacher-forced, picks the token its
  // CUDA backend chose (-1: not recorded).
  int backend_agree = -1;
};

struct Golden {
  int n_vocab = 0;
  std::string model_sha256;
  std::string synth_args;  // for synthetic models: the `sluice synth` arguments that make it
  std::vector<GoldenCase> cases;
  std::vector<float> first_logits;  // cases.size() * n_vocab
};

// dir: "golden" (llama.cpp's CPU backend) or "golden-cuda" (its CUDA backend, every layer
// offloaded; tools/golden/make_fixtures.sh with BACKEND=cuda).
Golden load_golden(const std::string& name, const std::string& dir = "golden") {
  Golden g;
  std::ifstream in(test::fixture_path(dir + "/" + name + ".json"));
  EXPECT_TRUE(in.good()) << "missing fixture " << name;
  if (!in.good()) return g;
  nlohmann::json j = nlohmann::json::parse(in);
  g.n_vocab = j.at("n_vocab").get<int>();
  g.model_sha256 = j.value("model_sha256", "");
  g.synth_args = j.value("synth_args", "");
  for (const auto& c : j.at("cases")) {
    GoldenCase gc;
    gc.prompt = c.at("prompt").get<std::string>();
    gc.prompt_ids = c.at("prompt_ids").get<std::vector<int32_t>>();
    gc.tokens = c.at("tokens").get<std::vector<int32_t>>();
    gc.gaps = c.at("top2_gap").get<std::vector<float>>();
    gc.noise = c.at("self_noise").get<std::vector<float>>();
    gc.backend_agree = c.value("backend_agree", -1);
    for (const auto& pos : c.at("top8")) {
      std::vector<std::pair<int, float>> t;
      for (const auto& e : pos) t.push_back({e.at(0).get<int>(), e.at(1).get<float>()});
      gc.top8.push_back(std::move(t));
    }
    g.cases.push_back(std::move(gc));
  }
  std::ifstream lf(test::fixture_path(dir + "/" + name + ".logits.f32"), std::ios::binary);
  g.first_logits.resize(size_t(g.n_vocab) * g.cases.size());
  lf.read(reinterpret_cast<char*>(g.first_logits.data()), std::streamsize(g.first_logits.size() * sizeof(float)));
  EXPECT_EQ(size_t(lf.gcount()), g.first_logits.size() * sizeof(float)) << "short logits fixture " << name;
  return g;
}

int argmax(const float* v, int n) { return int(std::max_element(v, v + n) - v); }

// Runs every case of a fixture against the model at `path` and reports the agreement figures.
// literal_exemption: empty to enforce the literal rule on free-running continuations
// (identical, or the first differing position is a llama.cpp top-2 gap below kNearTie = 1e-2)
// and top-1 agreement at every first position; otherwise the reason it cannot hold, and only the
// noise-calibrated rule is enforced (a first-position top-1 may then differ at a near-tie, as any
// greedy token may). tol_factor: tol = tol_factor x the prompt's largest llama.cpp noise.
// allowed_logit_outliers: positions (in all) whose top-8 logits may exceed the bound; see below.
//
// Mixtures of experts: where a token's router has a near-tie between its last chosen expert and the
// next, a last-bit difference in the router's input switches one expert of one layer, which moves
// that position's logits by tenths (measured: 0.42 and 0.95 at one position each of two quantized
// Mixtral fixtures, greedy tokens all equal). llama.cpp's noise estimate (flash attention on vs off)
// rarely sees such a switch. So MoE models may exceed the logit bound at this many positions in all
// (of 192); every other rule holds.
constexpr int kMoeRouterFlipPositions = 2;

// SLUICE_GOLDEN_BACKEND=cuda runs the fixtures on the CUDA backend instead of the CPU (the GPU
// machine: scripts/gpu-real-models.sh); every rule below applies unchanged, except the literal
// 1e-2 rule, which only the CPU's op-for-op order can meet (CUDA sums each dot product in its own
// order, with int8 activations quantized per 32 values where the CPU's K-quant kernels use Q8_K).
bool golden_on_cuda() {
  const char* b = std::getenv("SLUICE_GOLDEN_BACKEND");
  return b != nullptr && std::string(b) == "cuda";
}

// What one fixture's comparison counted (teacher-forced positions).
struct GoldenTally {
  int agree = 0, positions = 0;
  int backend_agree = -1;  // llama.cpp's CPU-vs-CUDA agreement recorded in a CUDA fixture, else -1
};

// min_agreement: the per-fixture floor on teacher-forced agreement (lowered further to llama.cpp's
// own CPU-vs-CUDA agreement where the fixture records it). flips_within_observed: a greedy flip is
// also a near-tie where llama.cpp's top-2 gap is below twice the top-8 difference measured at that
// position, itself held to the prompt's bound (the MoE models on CUDA: a router switch at an
// earlier position changes the cached K/V, which llama.cpp's per-position noise never sees).
void check_model_against_golden(const std::string& path, const Golden& g, bool check_tokenizer,
                                std::string literal_exemption, float tol_factor = 2.0f,
                                int allowed_logit_outliers = 0, double min_agreement = kMinAgreement,
                                bool flips_within_observed = false, GoldenTally* tally = nullptr) {
  if (golden_on_cuda() && literal_exemption.empty()) {
    literal_exemption = "CUDA backend: its kernels sum in their own order, not llama.cpp CPU's";
  }
  auto file = gguf::File::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  auto tok = model::Tokenizer::from_gguf(*file);
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  model::LoadOptions opts;
  // Room for the longest prompt and its continuation (Gemma 3's long prompt passes its 512-token
  // sliding window).
  size_t longest = 0;
  for (const GoldenCase& c : g.cases) longest = std::max(longest, c.prompt_ids.size() + c.tokens.size());
  opts.n_ctx = std::max(512, int((longest + 255) / 256 * 256));
  if (golden_on_cuda()) opts.backend = model::BackendKind::kCuda;
  auto m = model::Model::load(path, opts);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  model::Model& mdl = **m;
  ASSERT_EQ(mdl.n_vocab(), g.n_vocab);

  const int nv = g.n_vocab;
  std::vector<float> logits(static_cast<size_t>(nv));
  float worst_rms = 0, worst_top8 = 0, worst_ratio = 0, worst_first_max = 0;
  int top1_first = 0, positions = 0, agree = 0, near_tie_flips = 0, identical_runs = 0, logit_outliers = 0;
  int diverged = 0, literal_ties = 0;  // free-running divergences; those at a gap below kNearTie
  float worst_first_gap = 0, noise_at_worst = 0;
  size_t shortest_prefix = SIZE_MAX;
  std::string gap_list;  // "prompt:position gap", one per diverging continuation
  for (size_t ci = 0; ci < g.cases.size(); ++ci) {
    const GoldenCase& c = g.cases[ci];
    SCOPED_TRACE("prompt: " + c.prompt);
    ASSERT_EQ(c.top8.size(), c.tokens.size());
    ASSERT_EQ(c.noise.size(), c.tokens.size());
    if (check_tokenizer) {
      EXPECT_EQ((*tok)->encode(c.prompt, (*tok)->add_bos_default(), true), c.prompt_ids);
    }
    // Teacher forcing: prompt, then llama.cpp's tokens one at a time.
    mdl.truncate(0);
    ASSERT_TRUE(mdl.eval(c.prompt_ids, logits).is_ok());
    const float* ref = &g.first_logits[ci * size_t(nv)];
    double sq = 0;
    for (int i = 0; i < nv; ++i) {
      ASSERT_TRUE(std::isfinite(logits[i])) << "logit " << i;
      sq += double(logits[i] - ref[i]) * double(logits[i] - ref[i]);
      worst_first_max = std::max(worst_first_max, std::fabs(logits[i] - ref[i]));
    }
    const float tol = tol_factor * *std::max_element(c.noise.begin(), c.noise.end());
    const float rms = float(std::sqrt(sq / nv));
    worst_rms = std::max(worst_rms, rms);
    EXPECT_LE(rms, std::max(kMinLogitTol, tol) / 2) << "first-position logits: RMS difference from llama.cpp";
    if (argmax(logits.data(), nv) == argmax(ref, nv)) {
      ++top1_first;
    } else if (!literal_exemption.empty()) {
      EXPECT_LT(c.gaps[0], std::max(kNearTie, 2 * c.noise[0]))
          << "first-position top-1 differs where llama.cpp's top-2 gap " << c.gaps[0] << " is not a near-tie";
    }
    std::vector<float> d8s(c.tokens.size(), 0.0f);  // top-8 difference per teacher-forced position
    for (size_t step = 0; step < c.tokens.size(); ++step) {
      if (step > 0) {
        const int32_t prev = c.tokens[step - 1];
        ASSERT_TRUE(mdl.eval(std::span<const int32_t>(&prev, 1), logits).is_ok());
      }
      ++positions;
      const float noise = c.noise[step];
      float d8 = 0;
      for (const auto& [id, v] : c.top8[step]) d8 = std::max(d8, std::fabs(logits[size_t(id)] - v));
      worst_top8 = std::max(worst_top8, d8);
      d8s[step] = d8;
      worst_ratio = std::max(worst_ratio, d8 / std::max(noise, 1e-6f));
      bool router_flip = false;
      if (d8 > std::max(kMinLogitTol, tol) && logit_outliers++ < allowed_logit_outliers) {
        std::printf("[golden]   position %zu: top-8 logits differ by %.3g (bound %.3g): router near-tie, allowed\n", step,
                    double(d8), double(std::max(kMinLogitTol, tol)));
        router_flip = true;
      } else {
        EXPECT_LE(d8, std::max(kMinLogitTol, tol)) << "position " << step << ": top-8 logits differ from llama.cpp by "
                                                   << d8 << " (llama.cpp's own noise " << noise << ")";
      }
      const int32_t ours = argmax(logits.data(), nv);
      if (ours == c.tokens[step]) {
        ++agree;
      } else if (router_flip) {
        ++near_tie_flips;  // the position whose experts switched (above): its token may switch too
      } else {
        ++near_tie_flips;
        EXPECT_LT(c.gaps[step], std::max({kNearTie, 2 * noise, flips_within_observed ? 2 * d8 : 0.0f}))
            << "position " << step << ": greedy token differs (ours " << ours << ", llama.cpp " << c.tokens[step]
            << ") where llama.cpp's top-2 gap " << c.gaps[step] << " exceeds twice its own noise " << noise
            << ": not a near-tie, so this is a bug";
      }
    }
    // Free-running greedy, for the report: how long our own continuation stays identical.
    mdl.truncate(0);
    ASSERT_TRUE(mdl.eval(c.prompt_ids, logits).is_ok());
    size_t same = 0;
    while (same < c.tokens.size() && argmax(logits.data(), nv) == c.tokens[same]) {
      const int32_t t = c.tokens[same++];
      if (same < c.tokens.size()) {
        ASSERT_TRUE(mdl.eval(std::span<const int32_t>(&t, 1), logits).is_ok());
      }
    }
    if (same < c.tokens.size()) {
      ++diverged;
      const float gap = c.gaps[same], noise = c.noise[same];
      if (gap < kNearTie) ++literal_ties;
      if (gap >= worst_first_gap) {
        worst_first_gap = gap;
        noise_at_worst = noise;
      }
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s#%zu@%zu %.3g", gap_list.empty() ? "" : ", ", ci, same, double(gap));
      gap_list += buf;
      // Up to the divergence the free run fed the same tokens, so the teacher-forced top-8
      // difference at that position is the one the free run saw.
      EXPECT_LT(gap, std::max({kNearTie, 2 * noise, flips_within_observed ? 2 * d8s[same] : 0.0f}))
          << "free-running continuation diverges at position " << same << " where llama.cpp's top-2 gap " << gap
          << " is not a near-tie (its own noise there " << noise << ")";
      if (literal_exemption.empty()) {
        EXPECT_LT(gap, kNearTie) << "free-running continuation diverges at position " << same
                                 << " where llama.cpp's top-2 gap " << gap
                                 << " is not below the literal near-tie threshold 1e-2: a bug";
      }
    }
    shortest_prefix = std::min(shortest_prefix, same);
    if (same == c.tokens.size()) ++identical_runs;
  }
  // Against a CUDA fixture the floor is also no higher than llama.cpp's own agreement between its
  // CPU and CUDA backends on the same tokens: two correct implementations of that backend pair.
  double floor = min_agreement * positions;
  const bool has_backend = std::all_of(g.cases.begin(), g.cases.end(), [](const GoldenCase& c) { return c.backend_agree >= 0; });
  int backend_agree = -1;
  if (has_backend) {
    backend_agree = 0;
    for (const GoldenCase& c : g.cases) backend_agree += c.backend_agree;
    floor = std::min(floor, double(backend_agree));
    std::printf("[golden] llama.cpp's CPU backend agrees with its CUDA backend at %d/%d positions; ours needs >= %.1f\n",
                backend_agree, positions, floor);
  }
  EXPECT_GE(agree, floor) << "greedy agreement with llama.cpp";
  if (tally) *tally = GoldenTally{agree, positions, backend_agree};
  std::printf("[golden] %s (%s): teacher-forced greedy agreement %d/%d positions (%d flips at near-ties); "
              "top-8 logits max|d| %.3g (worst %.2gx llama.cpp's own noise at that position); first-position RMS max %.3g, "
              "max|d| over the vocabulary %.3g, top-1 %d/%zu; "
              "free-running: %d/%zu continuations identical for %zu tokens, shortest identical prefix %zu; "
              "first divergences: %d, %d of them at llama.cpp top-2 gap < %.0e, largest gap %.3g (llama.cpp's own "
              "noise there %.3g)\n",
              path.c_str(), golden_on_cuda() ? "cuda" : "cpu", agree, positions, near_tie_flips, worst_top8, worst_ratio, worst_rms, worst_first_max, top1_first,
              g.cases.size(), identical_runs, g.cases.size(), g.cases.empty() ? 0 : g.cases[0].tokens.size(),
              shortest_prefix, diverged, literal_ties, double(kNearTie), worst_first_gap, noise_at_worst);
  std::printf("[golden]   first divergences (prompt#position gap): %s; literal rule (gap < 1e-2): %s\n",
              gap_list.empty() ? "none" : gap_list.c_str(),
              literal_exemption.empty() ? "enforced" : ("not enforced: " + literal_exemption).c_str());
  if (literal_exemption.empty()) {
    EXPECT_EQ(top1_first, int(g.cases.size()));
  }
}

// Where the literal rule cannot hold, and why: each format's dot products on the default CPU path
// sum in an order other than llama.cpp's, so logits differ in the last bits, which these random
// 2-layer models amplify to ~0.01-0.07, and a few of llama.cpp's greedy choices at top-2 gaps of
// 0.01-0.03 (above 1e-2) then flip. Measured with fixtures made on an AVX-512 x86 machine.
// (SmolLM2 Q4_1 and the F16 models are not exempt: SmolLM2's forward is llama.cpp's order op
// for op, its continuations identical; the F16 models' continuations are identical too.)
std::string literal_exemption(const std::string& name) {
  if (name == "llama-rope-q4_k")
    return "Q4_K: llama.cpp runs x86 Q4_K through its repacked 8-row kernels (repack.cpp gemv/gemm "
           "q4_K_8x8), whose f32 order our kernels do not follow; first divergence at gap 0.0305";
  if (name == "llama-rope-q8_0")
    return "Q8_0: our packed 16-row Q8_0 kernel sums in another order than llama.cpp's vec_dot (decode) "
           "and tinyBLAS (prefill); first divergence at gap 0.0134";
  if (name == "qwen2-q6_k" || name == "qwen3-q6_k")
    return "Q6_K: our packed 16-row Q6_K kernel sums each super-block's integers in one lane, llama.cpp's "
           "vec_dot in eight f32 lanes; first divergence at gap 0.0299 (qwen2) / 0.0254 (qwen3)";
  // Mixtures of experts: a router choice that flips at a near-tie switches whole experts, so
  // last-bit differences grow to tenths of a logit, in llama.cpp against itself too (flash
  // attention on vs off). Measured (AVX2 VM, fixtures made there, 2026-11-25): first divergences at
  // gaps 0.0118-0.0714 (mixtral q4_k_m; llama.cpp's own noise there up to 0.395) and 0.134
  // (qwen3moe q8_0; noise 0.217). The F16 models' continuations are identical.
  if (name.rfind("moe-", 0) == 0 && name.find("f16") == std::string::npos)
    return "quantized mixture of experts: router near-ties switch experts (llama.cpp's own noise 0.2-0.4 there)";
  // Without AVX-512 the quantized formats run the AVX2 kernels, whose f32 orders differ from the
  // AVX-512 paths the fixtures were made with (as for SmolLM2 below). Measured on a 2-core AVX2 VM
  // (2026-11-25): first divergences at gaps 0.0689 (qwen2 q4_k; llama.cpp's own noise there
  // 0.0651), 0.0276 (qwen2 q8_0; noise 0.0315), 0.0101 (qwen3 q4_k; noise 0.0311). The noise-scaled
  // near-tie rule stays enforced.
  if (quant::best_isa() < quant::Isa::kAvx512 && name.find("f16") == std::string::npos &&
      name.find("f32") == std::string::npos)
    return "this CPU lacks the AVX-512 kernels whose f32 order matches the fixtures' (made on AVX-512)";
  return "";
}

// Gemma 3 270M Q4_K_M amplifies last-bit differences far more than SmolLM2: llama.cpp's own
// flash-attention-on/off noise on the fixture's top-8 logits reaches 0.52-1.81 per prompt (its
// first-position logits are ~25 in magnitude; Gemma 3's residual stream runs to thousands before
// the post norms). Measured on this 2-core AVX2 VM (2026-11-25), teacher-forced over 8 x 32
// positions, three correct summation orders of sluice:
// - AVX2 kernels, AVX2 GeGLU (the default here): 249/256 greedy tokens equal, top-8 max |d| 3.58,
//   first-position RMS 0.97 (top-1 8/8), 4/8 free-running continuations identical, the others
//   first diverging at llama.cpp top-2 gaps 0.109, 0.185, 0.050, 0.119;
// - AVX2 kernels, libm-tanhf GeGLU: 249/256, top-8 3.45, RMS 0.55, 5/8 identical, gaps 0.109,
//   0.031, 0.030;
// - scalar reference kernels (SLUICE_QUANT_ISA=ref), AVX2 GeGLU: 248/256, top-8 2.64, RMS 0.42,
//   3/8 identical, gaps 0.161, 0.067, 0.814 (llama.cpp's own noise there 1.79), 0.031, 0.023.
// Every divergence is a near-tie by the noise rule; the literal 1e-2 rule holds for none of them,
// and the top-8 bound is 3x the prompt's noise (as for the requantized SmolLM2 fixtures below)
// since correct orders differ from llama.cpp by up to 2.4x it.
std::string gemma3_literal_exemption() {
  return "Gemma 3 amplifies summation-order differences to tenths of a logit (llama.cpp's own noise up to 1.8); "
         "first divergences at gaps 0.02-0.81 across sluice's kernel families, all near-ties by the noise rule";
}
constexpr float kGemma3TolFactor = 3.0f;

TEST(GoldenLlamaCpp, SmolLM2Q4_1) {
  const std::string path = test::model_path(test::kSmolLM2);
  SLUICE_REQUIRE_MODEL(path);
  Golden g = load_golden("smollm2");
  ASSERT_FALSE(g.cases.empty());
  // The op-for-op order holds where this CPU runs the AVX-512 paths the fixtures were made with.
  const std::string exemption =
      quant::best_isa() >= quant::Isa::kAvx512
          ? ""
          : "this CPU lacks the AVX-512 kernels whose f32 order matches the fixtures' (made on AVX-512)";
  check_model_against_golden(path, g, /*check_tokenizer=*/true, exemption);
}

// Gemma 3 270M Q4_K_M as published (the acceptance model): 8 prompts x 32 greedy tokens,
// the last prompt 719 tokens long so the sliding-window layers (window 512) drop their oldest
// positions. Its weights are Q5_0, Q8_0, Q4_K and Q6_K; the fixture was made on this AVX2 VM.
TEST(GoldenLlamaCpp, Gemma3_270M) {
  const std::string path = test::model_path(test::kGemma3);
  SLUICE_REQUIRE_MODEL(path);
  Golden g = load_golden("gemma3-270m");
  ASSERT_EQ(g.cases.size(), 8u);
  ASSERT_GT(g.cases.back().prompt_ids.size(), 512u) << "the long prompt must pass the sliding window";
  check_model_against_golden(path, g, /*check_tokenizer=*/true, gemma3_literal_exemption(), kGemma3TolFactor);
}

// Chat through the file's chat format: the published GGUF has no tokenizer.chat_template, so the
// format comes from the architecture and vocabulary (model::ChatTemplate::for_architecture). The
// rendered and tokenized user turn equals the chat prompt llama.cpp was given in the golden
// fixture (prompts 3 and 4, written in Gemma's <start_of_turn> format), and the model's greedy
// reply to it is the fixture's.
TEST(GoldenLlamaCpp, Gemma3ChatTemplate) {
  const std::string path = test::model_path(test::kGemma3);
  SLUICE_REQUIRE_MODEL(path);
  Golden g = load_golden("gemma3-270m");
  auto file = gguf::File::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  ASSERT_EQ(file->find("tokenizer.chat_template"), nullptr) << "the file now carries a template: test it";
  auto tmpl = app::chat_template_for(*file, "");
  ASSERT_TRUE(tmpl.is_ok()) << tmpl.status().message();
  EXPECT_EQ(tmpl->family(), model::ChatFamily::kGemma);
  auto tok = model::Tokenizer::from_gguf(*file);
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  const struct {
    size_t fixture_case;
    const char* user;
  } turns[] = {{3, "What is the boiling point of water?"}, {4, "Write a haiku about autumn leaves."}};
  for (const auto& t : turns) {
    SCOPED_TRACE(t.user);
    const model::ChatMessage msgs[] = {{"user", t.user}};
    auto text = tmpl->apply(msgs, /*add_generation_prompt=*/true);
    ASSERT_TRUE(text.is_ok()) << text.status().message();
    EXPECT_EQ(*text, g.cases[t.fixture_case].prompt);
    EXPECT_EQ((*tok)->encode(*text, (*tok)->add_bos_default(), /*parse_special=*/true),
              g.cases[t.fixture_case].prompt_ids);
  }
  EXPECT_TRUE((*tok)->is_end_of_generation(106)) << "<end_of_turn> must end a reply";
}

// Synthetic random-weight models of the other architectures and formats: regenerated here with
// `sluice synth` and the fixture's arguments (deterministic: reference quantizers, fixed seed),
// checked to be byte-identical (sha256) to the file llama.cpp was run on, then compared.
class GoldenSynth : public ::testing::TestWithParam<std::string> {};

std::string sha256_of(const std::string& path) {
  std::string cmd = "sha256sum '" + path + "'";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  char buf[128] = {};
  std::string out = std::fgets(buf, sizeof buf, p) ? std::string(buf) : "";
  pclose(p);
  return out.substr(0, out.find(' '));
}

// On CUDA the oracle is llama.cpp's CUDA backend where a fixture of it exists: both GPU backends
// quantize activations per 32 values and sum in warp orders, and that fixture's noise includes
// llama.cpp's own CPU-vs-CUDA disagreement at each position (tools/golden/llama_fixture.cpp).
std::string synth_fixture_dir(const std::string& name) {
  if (golden_on_cuda() && std::filesystem::exists(test::fixture_path("golden-cuda/" + name + ".json"))) return "golden-cuda";
  return "golden";
}

// Against llama.cpp's CUDA fixtures the per-fixture floor is 90%: which near-ties flip differs from
// one correct implementation to the next by several positions per fixture (measured, H200: sluice's
// CUDA backend, sluice's CPU backend and llama.cpp's CPU backend each agree with llama.cpp's CUDA
// backend at 4293-4296 of 4416 positions in all, with per-fixture counts 7 apart), so agreement is
// held to llama.cpp's own over all fixtures at once (GoldenSynthCuda below).
constexpr double kCudaFixtureMinAgreement = 0.90;

// Writes the fixture's model with `sluice synth`, checks it is the file llama.cpp ran, compares.
void check_synth_fixture(const std::string& name, GoldenTally* tally) {
  const std::string dir = synth_fixture_dir(name);
  std::printf("[golden] %s: fixture %s/\n", name.c_str(), dir.c_str());
  Golden g = load_golden(name, dir);
  ASSERT_FALSE(g.synth_args.empty());
  ASSERT_FALSE(g.cases.empty());
  const std::string tmp = (std::filesystem::temp_directory_path() / ("sluice-golden-" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(tmp);
  const std::string path = tmp + "/" + name + ".gguf";
  std::vector<std::string> args{"synth"};
  std::istringstream in(g.synth_args);
  for (std::string a; in >> a;) args.push_back(a);
  args.push_back("-o");
  args.push_back(path);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ASSERT_EQ(app::cmd_synth(int(argv.size()), argv.data()), 0);
  ASSERT_EQ(sha256_of(path), g.model_sha256) << "sluice synth " << g.synth_args
                                             << " no longer writes the file the fixture was made from; regenerate "
                                                "fixtures with tools/golden/make_fixtures.sh";
  const bool moe = name.rfind("moe-", 0) == 0, cuda_fixture = dir == "golden-cuda";
  // Flips within the observed difference: the MoE models on CUDA, and on the CPU where its kernels
  // are not the fixtures' (a 2-core AVX-512 VM, 2026-11-29: moe-qwen2moe-q4_k_m flips at position
  // 7 of a prompt at llama.cpp top-2 gap 0.177 against its own noise 0.040 there, an earlier
  // router switch having changed the cached K/V).
  check_model_against_golden(path, g, /*check_tokenizer=*/true, literal_exemption(name), 2.0f,
                             moe ? kMoeRouterFlipPositions : 0, cuda_fixture ? kCudaFixtureMinAgreement : kMinAgreement,
                             /*flips_within_observed=*/moe, tally);
  std::filesystem::remove_all(tmp);
}

TEST_P(GoldenSynth, MatchesLlamaCpp) { check_synth_fixture(GetParam(), nullptr); }

std::vector<std::string> synth_fixtures();

// On CUDA, over every synthetic fixture at once: sluice's CUDA backend agrees with llama.cpp's
// CUDA backend at least as often as llama.cpp's own CPU backend does, less two standard
// deviations of that count (sqrt of llama.cpp's own disagreements, Poisson).
TEST(GoldenSynthCuda, AgreesWithLlamaCppAsOftenAsItsCpuBackend) {
  if (!golden_on_cuda()) GTEST_SKIP() << "SLUICE_GOLDEN_BACKEND=cuda runs this (GPU machine)";
  int agree = 0, positions = 0, backend_agree = 0, fixtures = 0;
  for (const std::string& name : synth_fixtures()) {
    if (synth_fixture_dir(name) != "golden-cuda") continue;
    GoldenTally t;
    check_synth_fixture(name, &t);
    ASSERT_GE(t.backend_agree, 0) << name << ": the CUDA fixture lacks backend_agree";
    agree += t.agree;
    positions += t.positions;
    backend_agree += t.backend_agree;
    ++fixtures;
  }
  ASSERT_GT(fixtures, 0) << "no CUDA fixtures";
  const double slack = 2 * std::sqrt(double(positions - backend_agree));
  std::printf("[golden] all %d CUDA fixtures: ours %d/%d, llama.cpp CPU vs CUDA %d/%d (floor %.1f)\n", fixtures, agree,
              positions, backend_agree, positions, backend_agree - slack);
  EXPECT_GE(agree, backend_agree - slack);
}

// The CUDA fixtures (checked on the GPU machine only) describe the same models and prompts as the
// CPU ones: same file (sha256), same tokenization, same number of generated tokens per prompt.
TEST(GoldenCudaFixtures, DescribeTheCpuFixturesModels) {
  const auto dir = std::filesystem::path(test::fixture_path("golden-cuda"));
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no CUDA fixtures";
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".json") continue;
    const std::string name = e.path().stem().string();
    SCOPED_TRACE(name);
    const Golden cuda = load_golden(name, "golden-cuda");
    const Golden cpu = load_golden(name, "golden");
    EXPECT_EQ(cuda.model_sha256, cpu.model_sha256);
    EXPECT_EQ(cuda.synth_args, cpu.synth_args);
    EXPECT_EQ(cuda.n_vocab, cpu.n_vocab);
    ASSERT_EQ(cuda.cases.size(), cpu.cases.size());
    for (size_t i = 0; i < cuda.cases.size(); ++i) {
      EXPECT_EQ(cuda.cases[i].prompt_ids, cpu.cases[i].prompt_ids);
      EXPECT_EQ(cuda.cases[i].tokens.size(), cpu.cases[i].tokens.size());
      EXPECT_EQ(cuda.cases[i].noise.size(), cuda.cases[i].tokens.size());
    }
    ++n;
  }
  EXPECT_GT(n, 0);
}

std::vector<std::string> synth_fixtures() {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(test::fixture_path("golden"))) {
    const std::string f = e.path().filename().string();
    // Real models have tests of their own (SmolLM2 and its requantizations, Gemma 3).
    if (e.path().extension() == ".json" && f.rfind("smollm2", 0) != 0 && f.rfind("gemma3-270m", 0) != 0)
      names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

INSTANTIATE_TEST_SUITE_P(Models, GoldenSynth, ::testing::ValuesIn(synth_fixtures()), [](const auto& info) {
  std::string n = info.param;
  for (char& c : n) if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
});

// Real weights in the K-quant formats: SmolLM2 Q4_1 requantized by llama-quantize (the command
// is in each fixture's "requantize"; tools/golden/make_fixtures.sh). CI has no llama.cpp, so the
// test writes the same file with tests/golden/llama_quantize.h and checks its sha256 against the
// one the fixture recorded: the model compared is byte for byte the one llama.cpp ran.
struct RequantCase {
  const char* name;  // fixture smollm2-<name>
  test::llama_quantize::Ftype ftype;
};
class GoldenRequantized : public ::testing::TestWithParam<RequantCase> {};

// Why the literal 1e-2 rule cannot hold on these fixtures (measured). They were made on a 2-core
// x86 VM without AVX-512 (the fixtures' "cpu"); there sluice's AVX2 kernels reproduce llama.cpp's
// first-position logits bit for bit on some prompts (Q8_0: prompts 0 and 2) but not on others
// (its prefill goes through other kernels, e.g. tinyBLAS), and SmolLM2 amplifies last-bit
// differences to tenths of a logit: every format's free-running continuations first diverge at
// top-2 gaps of 0.02-0.38 (Q4_K_M 0.06-0.15, Q5_K_M 0.02-0.38, Q6_K 0.008-0.15, Q8_0 0.03-0.27,
// Q2_K 0.04-0.26), where llama.cpp's own flash-attention-on/off noise is of the same size, and all
// are near-ties by the noise rule. On AVX-512 CPUs the kernels differ from the fixtures' AVX2 ones.
std::string requant_literal_exemption() {
  return "fixtures made with llama.cpp's AVX2 kernels, whose f32 order sluice's kernels follow only in part; "
         "first divergences at gaps up to 0.38, all near-ties by the noise rule";
}
// The top-8 logit tolerance for these fixtures: 3x the prompt's largest llama.cpp noise, not 2x.
// Measured (teacher-forced top-8 logits, largest |difference| over a prompt's positions divided by
// that prompt's largest llama.cpp noise): sluice AVX2 vs llama.cpp 1.33 (Q4_K_M), 1.72 (Q5_K_M),
// 2.09 (Q6_K), 1.70 (Q8_0), 1.45 (Q2_K); sluice's own two correct kernel families, AVX2 vs the
// scalar reference, differ by up to 1.20, 1.74, 2.91, 1.81, 1.23: the 2x of the Q4_1 test is
// tighter than two orders of the same sums on this model's Q6_K layers.
constexpr float kRequantTolFactor = 3.0f;

TEST_P(GoldenRequantized, MatchesLlamaCpp) {
  const std::string src = test::model_path(test::kSmolLM2);
  SLUICE_REQUIRE_MODEL(src);
  const std::string name = std::string("smollm2-") + GetParam().name;
  Golden g = load_golden(name);
  ASSERT_FALSE(g.cases.empty());
  auto in = gguf::File::open(src);
  ASSERT_TRUE(in.is_ok()) << in.status().message();
  const std::string dir = (std::filesystem::temp_directory_path() / ("sluice-requant-" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + name + ".gguf";
  const Status st = test::llama_quantize::requantize(*in, GetParam().ftype, path);
  ASSERT_TRUE(st.is_ok()) << st.message();
  ASSERT_EQ(sha256_of(path), g.model_sha256)
      << "tests/golden/llama_quantize.h no longer writes the file llama-quantize wrote for this fixture; it must "
         "reproduce llama.cpp's quantizers bit for bit";
  {
    auto out = gguf::File::open(path);
    ASSERT_TRUE(out.is_ok()) << out.status().message();
    std::map<std::string, int> types;
    for (const auto& t : out->tensors()) {
      if (t.shape.size() > 1) ++types[quant::type_name(t.type)];
    }
    std::string mix;
    for (const auto& [t, n] : types) mix += (mix.empty() ? "" : ", ") + std::to_string(n) + " " + t;
    std::printf("[golden] %s (%s): matrices %s\n", name.c_str(), test::llama_quantize::ftype_name(GetParam().ftype),
                mix.c_str());
  }
  // On AVX-512 the kernels are not the fixtures' (AVX2): a flip counts as a near-tie also where
  // llama.cpp's top-2 gap is below twice the top-8 difference measured at that position (itself
  // held to 3x the noise). Measured on a 2-core AVX-512 VM (2026-11-29): q5_k_m flips at position
  // 56 of a prompt at gap 0.480 against llama.cpp's noise 0.235 there (the plain rule's bound 0.470).
  check_model_against_golden(path, g, /*check_tokenizer=*/true, requant_literal_exemption(), kRequantTolFactor, 0,
                             kMinAgreement, /*flips_within_observed=*/quant::best_isa() >= quant::Isa::kAvx512);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(SmolLM2, GoldenRequantized,
                         ::testing::Values(RequantCase{"q4_k_m", test::llama_quantize::Ftype::kQ4_K_M},
                                           RequantCase{"q5_k_m", test::llama_quantize::Ftype::kQ5_K_M},
                                           RequantCase{"q6_k", test::llama_quantize::Ftype::kQ6_K},
                                           RequantCase{"q8_0", test::llama_quantize::Ftype::kQ8_0},
                                           RequantCase{"q2_k", test::llama_quantize::Ftype::kQ2_K}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace sluice
