// CPU streaming on SmolLM2-135M: greedy output and logits of a streamed model (RAM budget a quarter
// of the weights, 2 and 3 slots) against the all-resident model; budget-too-small and file
// truncated-while-running errors.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "model/model.h"
#include "stream/cpu_streamer.h"
#include "model_test_util.h"
#include "test_util.h"

namespace sluice::stream {
namespace {

const std::vector<int32_t> kPrompt = {1, 504, 3458, 282, 4649, 314, 2725, 30, 378, 3458, 282};

using test::GreedyRun;

GreedyRun greedy(model::Model& m, int n) { return test::greedy_run(m, kPrompt, n); }

uint64_t weight_bytes(const std::string& path) {
  auto f = gguf::File::open(path);
  uint64_t b = 0;
  for (const auto& t : f->tensors()) b += t.nbytes;
  return b;
}

// A quarter of the weights, or the smallest budget `slots` slots fit in when that is more.
uint64_t test_budget(const std::string& path, int slots) {
  auto layout = layout_of(*gguf::File::open(path));
  EXPECT_TRUE(layout.is_ok());
  uint64_t largest = 0;
  for (const auto& u : layout->layers) largest = std::max(largest, u.bytes);
  return std::max(weight_bytes(path) / 4, layout->globals.bytes + uint64_t(slots) * largest);
}

Result<std::unique_ptr<model::Model>> load_streamed(const std::string& path, uint64_t budget, int slots,
                                                    CpuLayerStreamer** s, const IoOptions& io = {},
                                                    TraceWriter* trace = nullptr) {
  model::LoadOptions o;
  o.n_ctx = 256;
  CpuStreamOptions so;
  so.ram_budget = budget;
  so.n_slots = slots;
  so.io = io;
  so.trace = trace;
  o.layer_source = cpu_streaming_source(path, so, s);
  return model::Model::load(path, o);
}

TEST(StreamCpu, GreedyMatchesResidentWithQuarterBudget) {
  const std::string path = test::model_path(test::kSmolLM2);
  SLUICE_REQUIRE_MODEL(path);
  model::LoadOptions o;
  o.n_ctx = 256;
  o.cpu_pack_weights = false;  // as the streamer, which keeps every tensor in the file's layout
  auto ref_model = model::Model::load(path, o);
  ASSERT_TRUE(ref_model.is_ok()) << ref_model.status().message();
  const GreedyRun ref = greedy(**ref_model, 12);
  ASSERT_EQ(ref.tokens.size(), 12u);

  const uint64_t quarter = weight_bytes(path) / 4;
  for (int slots : {2, 3}) {
    // SmolLM2's 28.7 MiB of non-layer tensors (the embedding) exceed a quarter of its 92 MiB,
    // so here the budget is the stated minimum (the synthetic e2e test uses a true quarter).
    const uint64_t budget = test_budget(path, slots);
    EXPECT_GE(budget, quarter);
    CpuLayerStreamer* s = nullptr;
    auto m = load_streamed(path, budget, slots, &s);
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    ASSERT_NE(s, nullptr);
    EXPECT_LE(s->owned_bytes(), budget) << "slots " << slots;
    EXPECT_GT(s->plan().plan.disk_bytes, 0u) << "the budget must force streaming";
    const GreedyRun got = greedy(**m, 12);
    EXPECT_EQ(got.tokens, ref.tokens) << "slots " << slots;
    ASSERT_EQ(got.first_logits.size(), ref.first_logits.size());
    // Same bytes, same kernels: only the weight pointers differ, so the logits are identical.
    EXPECT_EQ(got.first_logits, ref.first_logits) << "slots " << slots;
    EXPECT_EQ(s->stats().decode_passes, 11u);
    EXPECT_EQ(s->stats().decode_bytes_read, 11 * s->plan().plan.disk_bytes);
  }
}

// Layers split into many small requests (a stand-in for 500 MB layers against 4 MiB requests),
// through both readers: same tokens; the trace holds one read per streamed layer per pass, each
// in its slot's lane, and one compute row per layer per pass.
TEST(StreamCpu, SmallRequestsAndTraceGiveTheSameTokens) {
  const std::string path = test::model_path(test::kSmolLM2);
  SLUICE_REQUIRE_MODEL(path);
  model::LoadOptions o;
  o.n_ctx = 256;
  o.cpu_pack_weights = false;  // as the streamer, which keeps every tensor in the file's layout
  auto ref_model = model::Model::load(path, o);
  ASSERT_TRUE(ref_model.is_ok()) << ref_model.status().message();
  const GreedyRun ref = greedy(**ref_model, 6);
  for (IoKind kind : {IoKind::kUring, IoKind::kPread}) {
    IoOptions io;
    io.kind = kind;
    io.chunk_bytes = 64 * 1024;  // a 2.1 MiB layer = 34 requests through a queue of 2
    io.queue_depth = 2;
    const std::string trace_path = test::source_dir() + "/build-test-io/trace_" + std::to_string(::getpid()) + ".csv";
    std::filesystem::create_directories(std::filesystem::path(trace_path).parent_path());
    auto trace = TraceWriter::open(trace_path);
    ASSERT_TRUE(trace.is_ok()) << trace.status().message();
    CpuLayerStreamer* s = nullptr;
    auto m = load_streamed(path, test_budget(path, 2), 2, &s, io, trace->get());
    if (!m.is_ok() && kind == IoKind::kUring && m.status().code() == ErrorCode::kUnsupported) continue;
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    const GreedyRun got = greedy(**m, 6);
    EXPECT_EQ(got.tokens, ref.tokens) << io_kind_name(kind);
    EXPECT_EQ(got.first_logits, ref.first_logits) << io_kind_name(kind);
    const int n_layer = int(s->plan().input.units.size());
    int n_streamed = 0;
    for (const auto& u : s->plan().plan.units) n_streamed += u.home == Home::kDisk;
    const uint64_t passes = s->stats().passes;
    m->reset();  // the streamer stops appending
    ASSERT_TRUE((*trace)->flush().is_ok());
    std::ifstream in(trace_path);
    std::string line;
    std::getline(in, line);
    EXPECT_EQ(line, TraceWriter::kHeader);
    uint64_t reads = 0, computes = 0, loads = 0;
    while (std::getline(in, line)) {
      std::vector<std::string> f;
      std::stringstream ls(line);
      for (std::string x; std::getline(ls, x, ',');) f.push_back(x);
      ASSERT_EQ(f.size(), 7u) << line;
      EXPECT_LE(std::stoll(f[0]), std::stoll(f[1])) << line;
      if (f[2].rfind("disk slot ", 0) == 0) {
        ++reads;
        EXPECT_EQ(f[5], "disk");
        EXPECT_TRUE(f[2] == "disk slot 0" || f[2] == "disk slot 1") << line;
        EXPECT_EQ(f[4], "blk." + f[3]);
      } else if (f[2] == "cpu") {
        ++computes;
      } else if (f[2] == "load") {
        ++loads;
      }
    }
    EXPECT_EQ(loads, 1u);
    EXPECT_EQ(reads, passes * uint64_t(n_streamed));
    EXPECT_EQ(computes, passes * uint64_t(n_layer));
    std::filesystem::remove(trace_path);
  }
}

TEST(StreamCpu, BudgetBelowMinimumStatesIt) {
  const std::string path = test::model_path(test::kSmolLM2);
  SLUICE_REQUIRE_MODEL(path);
  auto m = load_streamed(path, 8ull << 20, 2, nullptr);
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("too small: at least"), std::string::npos) << m.status().message();
}

// A copy of the model, truncated after the first token: the next pass must fail with an I/O
// error (file changed), and reads issued after the truncation must fail (short read), never
// hand the layer loop a half-filled slot.
TEST(StreamCpu, FileTruncatedWhileRunningIsAnError) {
  const std::string src = test::model_path(test::kSmolLM2);
  SLUICE_REQUIRE_MODEL(src);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("sluice_stream_trunc_" + std::to_string(::getpid()) + ".gguf")).string();
  std::filesystem::copy_file(src, path, std::filesystem::copy_options::overwrite_existing);
  CpuLayerStreamer* s = nullptr;
  auto m = load_streamed(path, test_budget(path, 2), 2, &s);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  std::vector<float> logits(size_t((*m)->n_vocab()));
  ASSERT_TRUE((*m)->eval(std::vector<int32_t>{1, 504}, logits).is_ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 3);

  // Bypassing begin_pass's check: the reads submitted from now on hit the truncated region.
  Status first_error;
  int ok_after_error = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (int l = 0; l < (*m)->n_ctx() && l < 30; ++l) {
      auto lw = s->acquire(l);
      if (!lw.is_ok()) {
        if (first_error.is_ok()) first_error = lw.status();
        continue;
      }
      if (!first_error.is_ok()) ++ok_after_error;
      s->release(l);
    }
  }
  EXPECT_EQ(first_error.code(), ErrorCode::kIo) << first_error.message();
  EXPECT_EQ(ok_after_error, 0);

  Status st = (*m)->eval(std::vector<int32_t>{42}, logits);
  EXPECT_EQ(st.code(), ErrorCode::kIo);
  EXPECT_FALSE(st.is_ok());
  std::filesystem::remove(path);
}

TEST(StreamCpu, ModelFileChangedIsDetectedAtTheNextToken) {
  const std::string src = test::model_path(test::kSmolLM2);
  SLUICE_REQUIRE_MODEL(src);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("sluice_stream_chg_" + std::to_string(::getpid()) + ".gguf")).string();
  std::filesystem::copy_file(src, path, std::filesystem::copy_options::overwrite_existing);
  auto m = load_streamed(path, test_budget(path, 2), 2, nullptr);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  std::vector<float> logits(size_t((*m)->n_vocab()));
  ASSERT_TRUE((*m)->eval(std::vector<int32_t>{1}, logits).is_ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4096);
  Status st = (*m)->eval(std::vector<int32_t>{42}, logits);
  EXPECT_EQ(st.code(), ErrorCode::kIo);
  EXPECT_NE(st.message().find("changed while running"), std::string::npos) << st.message();
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace sluice::stream
