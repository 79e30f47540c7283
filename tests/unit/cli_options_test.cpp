// Shared CLI plumbing: error -> exit code mapping, flag parsing outcomes, sampling resolution.
#include <CLI/CLI.hpp>
#include <vector>

#include "app/commands.h"
#include "app/common.h"
#include "app/options.h"
#include "test_util.h"

namespace sluice::app {
namespace {

// CLI11 wants a mutable argv.
struct Argv {
  explicit Argv(std::vector<std::string> a) : args(std::move(a)) {
    for (auto& s : args) ptrs.push_back(s.data());
  }
  int argc() { return int(ptrs.size()); }
  char** argv() { return ptrs.data(); }
  std::vector<std::string> args;
  std::vector<char*> ptrs;
};

TEST(CliOptions, BadInputErrorsExitTwoOthersOne) {
  EXPECT_EQ(exit_code_for(Status::ok()), kExitOk);
  EXPECT_EQ(exit_code_for(invalid_argument("x")), kExitBadInput);
  EXPECT_EQ(exit_code_for(corrupt_file("x")), kExitBadInput);
  EXPECT_EQ(exit_code_for(unsupported("x")), kExitBadInput);
  EXPECT_EQ(exit_code_for(io_error("x")), kExitBadInput);
  EXPECT_EQ(exit_code_for(out_of_memory("x")), kExitFailure);
  EXPECT_EQ(exit_code_for(internal_error("x")), kExitFailure);
}

TEST(CliOptions, ParseFlagsMapsHelpToZeroAndErrorsToTwo) {
  auto parse = [](std::vector<std::string> args, ModelFlags& mf, SamplingFlags& sf) {
    CLI::App app{"test", "sluice test"};
    add_model_flags(app, mf);
    add_sampling_flags(app, sf);
    Argv a(std::move(args));
    return parse_flags(app, a.argc(), a.argv());
  };
  ModelFlags mf;
  SamplingFlags sf;
  EXPECT_EQ(parse({"run", "-m", "x.gguf", "--temp", "0.5", "--seed", "9", "-c", "64"}, mf, sf), std::nullopt);
  EXPECT_EQ(mf.model_path, "x.gguf");
  EXPECT_EQ(mf.n_ctx, 64);
  EXPECT_FLOAT_EQ(sf.params.temperature, 0.5f);
  auto p = resolve_sampling(sf);
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(p->seed, 9u);

  ModelFlags mf2;
  SamplingFlags sf2;
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  EXPECT_EQ(parse({"run", "--help"}, mf2, sf2), std::optional<int>(kExitOk));
  EXPECT_EQ(parse({"run", "-m", "x", "--bogus"}, mf2, sf2), std::optional<int>(kExitBadInput));
  EXPECT_EQ(parse({"run"}, mf2, sf2), std::optional<int>(kExitBadInput));  // -m is required
  EXPECT_EQ(parse({"run", "-m", "x", "--temp", "warm"}, mf2, sf2), std::optional<int>(kExitBadInput));
  EXPECT_EQ(parse({"run", "-m", "x", "-c", "-3"}, mf2, sf2), std::optional<int>(kExitBadInput));
  testing::internal::GetCapturedStdout();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("bogus"), std::string::npos) << err;
}

std::optional<int> parse_stream(std::vector<std::string> args, StreamFlags& f) {
  CLI::App app{"test", "sluice test"};
  add_stream_flags(app, f);
  Argv a(std::move(args));
  return parse_flags(app, a.argc(), a.argv());
}

TEST(CliOptions, StreamFlagsParseAndAreCheckedBeforeLoading) {
  const auto parse = parse_stream;
  StreamFlags f;
  EXPECT_EQ(parse({"bench", "--ram-budget", "1.5G", "--slots", "3", "--trace", "t.csv", "--no-probe", "--plan"}, f),
            std::nullopt);
  EXPECT_EQ(f.n_slots, 3);
  EXPECT_EQ(f.trace_path, "t.csv");
  EXPECT_TRUE(f.no_probe && f.show_plan);
  auto b = resolve_stream_flags(f);
  ASSERT_TRUE(b.is_ok()) << b.status().message();
  EXPECT_EQ(**b, uint64_t(1.5 * (1ull << 30)));

  StreamFlags none;
  auto nb = resolve_stream_flags(none);
  ASSERT_TRUE(nb.is_ok());
  EXPECT_FALSE(nb->has_value()) << "no --ram-budget: the mmapped path";

  StreamFlags bad;
  bad.ram_budget = "lots";
  auto e = resolve_stream_flags(bad);
  ASSERT_FALSE(e.is_ok());
  EXPECT_EQ(exit_code_for(e.status()), kExitBadInput);
  EXPECT_NE(e.status().message().find("--ram-budget"), std::string::npos) << e.status().message();

  StreamFlags trace_only;
  trace_only.trace_path = "t.csv";
  auto t = resolve_stream_flags(trace_only);
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(exit_code_for(t.status()), kExitBadInput);
  EXPECT_NE(t.status().message().find("needs --ram-budget"), std::string::npos) << t.status().message();

  StreamFlags s;
  testing::internal::CaptureStderr();
  EXPECT_EQ(parse({"run", "--slots", "0"}, s), std::optional<int>(kExitBadInput));
  testing::internal::GetCapturedStderr();
}

// Ring slots: --slots as given, else 2, or 3 for the device pipeline when 16 or more sequences
// share a pass (a server; app/common.h stream_slots).
TEST(CliOptions, StreamSlotsDefaultToTwoAndThreeForADeviceStreamedServer) {
  StreamFlags f;
  ASSERT_EQ(parse_stream({"serve", "--vram-budget", "12G"}, f), std::nullopt);
  EXPECT_EQ(stream_slots(f, 1, /*device=*/true), 2);
  EXPECT_EQ(stream_slots(f, 15, /*device=*/true), 2);
  EXPECT_EQ(stream_slots(f, 16, /*device=*/true), 3);
  EXPECT_EQ(stream_slots(f, 32, /*device=*/true), 3);
  // CPU streaming (--ram-budget alone): its slots hold layers read from disk; unchanged.
  StreamFlags cpu;
  ASSERT_EQ(parse_stream({"serve", "--ram-budget", "1G"}, cpu), std::nullopt);
  EXPECT_EQ(stream_slots(cpu, 32, /*device=*/false), 2);
  for (const char* n : {"1", "2", "3", "4"}) {
    StreamFlags given;
    ASSERT_EQ(parse_stream({"serve", "--vram-budget", "auto", "--slots", n}, given), std::nullopt);
    for (int seqs : {1, 32}) {
      EXPECT_EQ(stream_slots(given, seqs, /*device=*/true), std::stoi(n)) << n << " slots, " << seqs << " sequences";
      EXPECT_EQ(stream_slots(given, seqs, /*device=*/false), std::stoi(n)) << n << " slots, " << seqs << " sequences";
    }
  }
}

TEST(CliOptions, AWholeModelLoadOutOfGpuMemoryFallsBackToTheDevicePipeline) {
  using model::BackendKind;
  const Status oom = out_of_memory("the model needs about 40000 MiB of GPU memory, 16000 MiB are free");
  const Status other = internal_error("cudaMalloc failed");
  // Out of GPU memory: cuda and auto stream through the GPU; with no GPU nothing to fall back to.
  EXPECT_EQ(after_whole_load(BackendKind::kCuda, true, oom), LoadFallback::kDevicePipeline);
  EXPECT_EQ(after_whole_load(BackendKind::kAuto, true, oom), LoadFallback::kDevicePipeline);
  EXPECT_EQ(after_whole_load(BackendKind::kAuto, false, oom), LoadFallback::kNone);
  // The GPU's own failures: auto runs on the CPU, an explicit cuda reports them.
  EXPECT_EQ(after_whole_load(BackendKind::kAuto, true, other), LoadFallback::kCpu);
  EXPECT_EQ(after_whole_load(BackendKind::kAuto, true, unsupported("cuda: no kernel for this format")), LoadFallback::kCpu);
  EXPECT_EQ(after_whole_load(BackendKind::kCuda, true, other), LoadFallback::kNone);
  // The file's or the flags' errors would stop the CPU too: they stand, with or without a GPU.
  for (const Status& user : {invalid_argument("n_ctx 9000 exceeds the model's context_length"),
                             corrupt_file("m.gguf: truncated"), io_error("m.gguf: no such file")}) {
    EXPECT_EQ(after_whole_load(BackendKind::kAuto, true, user), LoadFallback::kNone) << user.message();
  }
  // --backend cpu: its own errors stand.
  EXPECT_EQ(after_whole_load(BackendKind::kCpu, true, oom), LoadFallback::kNone);
  EXPECT_EQ(after_whole_load(BackendKind::kCpu, false, other), LoadFallback::kNone);
}

TEST(CliOptions, SkipKernelsParseToTheBackendsBitsAndNameUnknownKinds) {
  EXPECT_EQ(*parse_skip_kernels(""), 0u);
  EXPECT_EQ(*parse_skip_kernels("gemv"), uint32_t(backend::kCudaGemv));
  EXPECT_EQ(*parse_skip_kernels("norm,addnorm,rope,attn,glu"),
            uint32_t(backend::kCudaNorm | backend::kCudaAddNorm | backend::kCudaRope | backend::kCudaAttention |
                     backend::kCudaGlu));
  EXPECT_EQ(skip_kernel_names(*parse_skip_kernels("glu,norm")), "norm,glu");
  for (const char* bad : {"rms", "norm,", ",gemv", "GEMV", "norm,,glu"}) {
    auto r = parse_skip_kernels(bad);
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("known: norm,addnorm,rope,attn,glu,gemv"), std::string::npos) << r.status().message();
  }
}

TEST(CliOptions, ResolveSamplingValidatesAndDrawsASeedWhenNoneGiven) {
  CLI::App app{"test"};
  SamplingFlags sf;
  add_sampling_flags(app, sf);
  Argv a({"run", "--top-p", "1.5"});
  ASSERT_EQ(parse_flags(app, a.argc(), a.argv()), std::nullopt);
  auto bad = resolve_sampling(sf);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(exit_code_for(bad.status()), kExitBadInput);
  EXPECT_NE(bad.status().message().find("--top-p"), std::string::npos);

  CLI::App app2{"test"};
  SamplingFlags sf2;
  add_sampling_flags(app2, sf2);
  Argv b({"run"});
  ASSERT_EQ(parse_flags(app2, b.argc(), b.argv()), std::nullopt);
  // Two unseeded resolutions differ (64 random bits each).
  auto s1 = resolve_sampling(sf2), s2 = resolve_sampling(sf2);
  ASSERT_TRUE(s1.is_ok() && s2.is_ok());
  EXPECT_NE(s1->seed, s2->seed);
}

}  // namespace
}  // namespace sluice::app
