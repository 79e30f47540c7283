// Gemma 3 270M perplexity against llama.cpp's (issue 13: within 1% on the same text). Its own
// executable so the sanitizer build, which skips tests labelled slow (tests/CMakeLists.txt), does
// not run a minute of real-model prefill under ASan; the release build runs it.
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "app/commands.h"
#include "test_util.h"

namespace sluice {
namespace {

// Perplexity within 1% of llama.cpp's on the same text, windows and scoring: `sluice perplexity`
// itself runs (its stdout parsed) and is compared with the number llama-perplexity printed
// (tests/fixtures/perplexity/gemma3-270m.json holds it and the command). Windows of 1024 tokens
// pass the 512-token sliding window.
TEST(GoldenLlamaCpp, Gemma3PerplexityWithinOnePercent) {
  const std::string path = test::model_path(test::kGemma3);
  SLUICE_REQUIRE_MODEL(path);
  std::ifstream in(test::fixture_path("perplexity/gemma3-270m.json"));
  ASSERT_TRUE(in.good());
  const nlohmann::json j = nlohmann::json::parse(in);
  const double want = j.at("ppl").get<double>();
  std::vector<std::string> args{"perplexity", "-m", path, "-f", test::source_dir() + "/" + j.at("text").get<std::string>(),
                                "-c", std::to_string(j.at("n_ctx").get<int>()), "--chunks",
                                std::to_string(j.at("chunks").get<int>())};
  // SLUICE_GOLDEN_BACKEND=cuda: the same comparison on the CUDA backend (the GPU machine).
  if (const char* b = std::getenv("SLUICE_GOLDEN_BACKEND"); b != nullptr && *b) {
    args.insert(args.end(), {"-b", b});
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  testing::internal::CaptureStdout();
  const int rc = app::cmd_perplexity(int(argv.size()), argv.data());
  const std::string out = testing::internal::GetCapturedStdout();
  ASSERT_EQ(rc, 0) << out;
  const size_t at = out.find("Final estimate: PPL = ");
  ASSERT_NE(at, std::string::npos) << out;
  const double got = std::stod(out.substr(at + 22));
  std::printf("[golden] gemma3-270m perplexity: sluice %.4f, llama.cpp %.4f (%+.3f%%); running: %s\n", got, want,
              100.0 * (got - want) / want, out.substr(0, at).c_str());
  EXPECT_LT(std::fabs(got - want) / want, 0.01) << "sluice " << got << " vs llama.cpp " << want;
}

}  // namespace
}  // namespace sluice
