// Parity with llama.cpp on SmolLM2-135M: greedy tokens for 8 prompts x 64 tokens and the logits
// at the first generated position, against tests/fixtures/golden/smollm2.json (produced by
// tools/golden/make_fixtures.sh from a llama.cpp CPU build, flash attention off).
#include <cmath>
#include <fstream>
#include <string>
#include <nlohmann/json.hpp>

#include "parity/parity_util.h"
#include "test_util.h"

namespace sluice::test {
namespace {

// What is achievable: every op matches llama.cpp's semantics and rounding points (layer 0's
// attention and norms are bit-identical), but the quant kernels sum in a different order, so
// matmul outputs differ in the last bit. SmolLM2's large-activation layers (10-11, 27-29)
// amplify that to a few percent of the logits: measured max|delta| 0.7-1.0, normalized error
// 2e-2..9e-2 (our own ref vs AVX2 kernels differ by as much). Bounds are set just above.
constexpr double kMaxLogitError = 0.15;
// Greedy sequences may then part only at near ties: measured llama.cpp top-2 gaps at the first
// divergence 0.02..0.2 over two fixture generations; a real defect diverges at gaps of several
// logits.
constexpr float kNearTie = 0.3f;

TEST(ParitySmolLM2, GreedyTokensAndFirstLogitsMatchLlamaCpp) {
  SLUICE_REQUIRE_MODEL(model_path(kSmolLM2));
  std::ifstream js(fixture_path("golden/smollm2.json"));
  ASSERT_TRUE(js) << "missing fixture";
  const auto golden = nlohmann::json::parse(js);
  std::ifstream lf(fixture_path("golden/smollm2.logits.f32"), std::ios::binary);
  ASSERT_TRUE(lf);
  const int n_vocab = golden["n_vocab"];
  const int n_gen = golden["n_gen"];
  model::LoadOptions opts;
  opts.n_ctx = 512;
  auto m = model::Model::load(model_path(kSmolLM2), opts);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  ASSERT_EQ((*m)->n_vocab(), n_vocab);
  int identical = 0;
  for (const auto& c : golden["cases"]) {
    const std::string prompt = c["prompt"];
    SCOPED_TRACE(prompt);
    std::vector<float> ref(static_cast<size_t>(n_vocab));
    lf.read(reinterpret_cast<char*>(ref.data()), std::streamsize(ref.size() * 4));
    ASSERT_TRUE(lf);
    const auto ids = c["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = c["tokens"].get<std::vector<int32_t>>();
    const auto gaps = c["top2_gap"].get<std::vector<float>>();
    const GreedyRun run = greedy(**m, ids, n_gen);
    ASSERT_TRUE(run.status.is_ok()) << run.status.message();
    float max_abs = 0;
    for (int i = 0; i < n_vocab; ++i) max_abs = std::max(max_abs, std::fabs(run.first_logits[size_t(i)] - ref[size_t(i)]));
    EXPECT_LT(normalized_error(run.first_logits.data(), ref.data(), ref.size()), kMaxLogitError);
    EXPECT_EQ(argmax(run.first_logits), argmax(ref));
    size_t i = 0;
    while (i < want.size() && run.tokens[i] == want[i]) ++i;
    if (i == want.size()) {
      ++identical;
    } else {
      EXPECT_LT(gaps[i], kNearTie) << "diverged at token " << i << ": got " << run.tokens[i] << ", llama.cpp "
                                   << want[i] << " (top-2 gap " << gaps[i] << ")";
    }
    std::string shown = prompt.substr(0, 32);
    for (char& ch : shown)
      if (ch == '\n') ch = ' ';
    std::printf("[parity] %-32s first-logits max|d|=%.4f nerr=%.2e identical=%zu/%zu gap@div=%.3f\n",
                shown.c_str(), max_abs, normalized_error(run.first_logits.data(), ref.data(), ref.size()), i,
                want.size(), i < gaps.size() ? gaps[i] : -1.0f);
  }
  std::printf("[parity] %d of %zu cases identical for all tokens\n", identical, golden["cases"].size());
}

}  // namespace
}  // namespace sluice::test
