// Split GGUF models (llama.cpp's gguf-split): the shards of a model load as one logical File
// (metadata of the first, tensors of all, each tensor's bytes read from its shard), on a small
// model written here and on SmolLM2 split into 3 shards; and every way a shard set can be wrong
// is an error naming the file at fault: a missing shard, a shard given instead of the first, a
// name that does not follow gguf-split's, split.count / split.no / split.tensors.count that
// disagree, a tensor in two shards, a truncated (corrupt) shard.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf_split_util.h"
#include "test_util.h"

namespace sluice::gguf {
namespace {

namespace fs = std::filesystem;
using quant::Type;

// A scratch folder per test, removed afterwards.
class GgufSplit : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("sluice_split_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string at(const std::string& name) const { return (dir_ / name).string(); }

  // 7 tensors of several types, each filled with its own byte pattern.
  std::string write_model(const std::string& name, const std::string& tag = "a") {
    Writer w;
    w.add("general.architecture", Value::str("llama"));
    w.add("general.name", Value::str(tag));
    w.add("tokenizer.ggml.tokens", Value::string_array({"x", "y"}));
    const std::pair<const char*, Type> ts[] = {{"token_embd.weight", Type::kQ8_0}, {"blk.0.attn_norm.weight", Type::kF32},
                                               {"blk.0.attn_q.weight", Type::kQ4_K}, {"blk.0.ffn_down.weight", Type::kQ6_K},
                                               {"blk.1.attn_norm.weight", Type::kF32}, {"blk.1.attn_q.weight", Type::kQ4_1},
                                               {"output_norm.weight", Type::kF32}};
    std::vector<std::vector<uint8_t>> data;
    uint8_t fill = tag[0];
    for (const auto& [n, t] : ts) {
      std::vector<uint64_t> shape{256};
      if (t != Type::kF32) shape.push_back(3);
      EXPECT_TRUE(w.add_tensor(n, t, shape).is_ok());
      const uint64_t bytes = uint64_t(quant::row_bytes(t, 256)) * (t == Type::kF32 ? 1 : 3);
      std::vector<uint8_t> d(bytes);
      for (uint64_t i = 0; i < bytes; ++i) d[i] = uint8_t(fill + i * 7);
      ++fill;
      data.push_back(std::move(d));
    }
    const std::string path = at(name);
    EXPECT_TRUE(w.write(path, data).is_ok());
    return path;
  }

  fs::path dir_;
};

// The split File has the single file's tensors (same order, types, shapes and bytes) and its
// metadata plus the split keys; each tensor's file offset points at its bytes in its shard.
void expect_same_model(const File& split, const File& single) {
  ASSERT_EQ(split.tensors().size(), single.tensors().size());
  for (size_t i = 0; i < single.tensors().size(); ++i) {
    const TensorInfo& a = split.tensors()[i];
    const TensorInfo& b = single.tensors()[i];
    SCOPED_TRACE(b.name);
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.type, b.type);
    EXPECT_EQ(a.shape, b.shape);
    ASSERT_EQ(a.nbytes, b.nbytes);
    EXPECT_EQ(split.find_tensor(b.name), &a);
    EXPECT_EQ(std::memcmp(split.tensor_data(a), single.tensor_data(b), b.nbytes), 0);
    // The same bytes read by offset from the shard's file, as the streamers do.
    const Shard& sh = split.shards()[a.shard];
    std::vector<uint8_t> buf(std::min<uint64_t>(a.nbytes, 4096));
    const int fd = ::open(sh.path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pread(fd, buf.data(), buf.size(), off_t(split.file_offset(a))), ssize_t(buf.size()));
    ::close(fd);
    EXPECT_EQ(std::memcmp(buf.data(), single.tensor_data(b), buf.size()), 0);
  }
  for (const KeyValue& kv : single.metadata()) {
    const Value* v = split.find(kv.key);
    ASSERT_NE(v, nullptr) << kv.key;
    EXPECT_TRUE(*v == kv.value) << kv.key;
  }
  EXPECT_EQ(split.metadata().size(), single.metadata().size() + 3);
}

TEST_F(GgufSplit, ShardsLoadAsOneFile) {
  const std::string single_path = write_model("m.gguf");
  auto single = File::open(single_path);
  ASSERT_TRUE(single.is_ok()) << single.status().message();
  auto paths = test::write_gguf_split(*single, at("m"), 3);  // 7 tensors: 3 + 3 + 1
  ASSERT_TRUE(paths.is_ok()) << paths.status().message();
  ASSERT_EQ(paths->size(), 3u);
  EXPECT_EQ((*paths)[0], at("m-00001-of-00003.gguf"));
  auto split = File::open((*paths)[0]);
  ASSERT_TRUE(split.is_ok()) << split.status().message();
  EXPECT_TRUE(split->is_split());
  ASSERT_EQ(split->shards().size(), 3u);
  EXPECT_EQ(split->path(), (*paths)[0]);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(split->shards()[k].path, (*paths)[k]);
    EXPECT_EQ(split->shards()[k].size, fs::file_size((*paths)[k]));
    EXPECT_EQ(split->shards()[k].n_tensors, k < 2 ? 3u : 1u);
  }
  EXPECT_EQ(split->tensors()[2].shard, 0u);
  EXPECT_EQ(split->tensors()[3].shard, 1u);
  EXPECT_EQ(split->tensors()[6].shard, 2u);
  EXPECT_EQ(split->get_uint(kSplitCount).value(), 3u);
  expect_same_model(*split, *single);
  // The File moves with its mappings (the model keeps it).
  File moved = std::move(split).value();
  EXPECT_EQ(std::memcmp(moved.tensor_data(moved.tensors()[6]), single->tensor_data(single->tensors()[6]),
                        single->tensors()[6].nbytes),
            0);
  // A split of one shard is an ordinary file with split keys.
  auto one = test::write_gguf_split(*single, at("one"), 100);
  ASSERT_TRUE(one.is_ok());
  auto f1 = File::open((*one)[0]);
  ASSERT_TRUE(f1.is_ok()) << f1.status().message();
  EXPECT_FALSE(f1->is_split());
  expect_same_model(*f1, *single);
}

// SmolLM2 split into 3 shards as gguf-split --split-max-tensors 100 does (272 tensors: 100, 100,
// 72); the layer cut by each boundary has tensors in two files.
TEST_F(GgufSplit, SmolLM2InThreeShards) {
  const std::string src = test::model_path(test::kSmolLM2);
  SLUICE_REQUIRE_MODEL(src);
  auto single = File::open(src);
  ASSERT_TRUE(single.is_ok());
  auto paths = test::write_gguf_split(*single, at("smollm2"), 100);
  ASSERT_TRUE(paths.is_ok()) << paths.status().message();
  ASSERT_EQ(paths->size(), 3u);
  auto split = File::open((*paths)[0]);
  ASSERT_TRUE(split.is_ok()) << split.status().message();
  ASSERT_EQ(split->shards().size(), 3u);
  EXPECT_EQ(split->shards()[2].n_tensors, 72u);
  expect_same_model(*split, *single);
  uint64_t total = 0;
  for (const Shard& s : split->shards()) total += s.size;
  // Each shard repeats only a small header (the first one carries the vocabulary).
  EXPECT_LT(total, fs::file_size(src) + 64 * 1024);
}

TEST(GgufSplitPaths, FollowGgufSplitNaming) {
  auto p = split_paths("/m/model-00002-of-00003.gguf", 1, 3);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(*p, (std::vector<std::string>{"/m/model-00001-of-00003.gguf", "/m/model-00002-of-00003.gguf",
                                          "/m/model-00003-of-00003.gguf"}));
  EXPECT_FALSE(split_paths("/m/model-00001-of-00003.gguf", 1, 3).is_ok());  // not shard 2
  EXPECT_FALSE(split_paths("/m/model.gguf", 0, 3).is_ok());
  EXPECT_FALSE(split_paths("-00001-of-00003.gguf", 0, 3).is_ok());  // no prefix
  const Status st = split_paths("/m/model.gguf", 0, 3).status();
  EXPECT_NE(st.message().find("-00001-of-00003.gguf"), std::string::npos) << st.message();
}

// Expects an error of `code` whose message contains every one of `parts`.
void expect_error(const Result<File>& r, ErrorCode code, const std::vector<std::string>& parts) {
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), code) << r.status().message();
  for (const auto& p : parts) EXPECT_NE(r.status().message().find(p), std::string::npos) << r.status().message();
}

TEST_F(GgufSplit, MissingShardNamesIt) {
  auto single = File::open(write_model("m.gguf"));
  auto paths = test::write_gguf_split(*single, at("m"), 3);
  ASSERT_TRUE(paths.is_ok());
  fs::remove((*paths)[2]);
  expect_error(File::open((*paths)[0]), ErrorCode::kIo, {(*paths)[2], "missing", "shard 3 of 3"});
}

TEST_F(GgufSplit, LaterShardGivenPointsToTheFirst) {
  auto single = File::open(write_model("m.gguf"));
  auto paths = test::write_gguf_split(*single, at("m"), 3);
  ASSERT_TRUE(paths.is_ok());
  expect_error(File::open((*paths)[1]), ErrorCode::kInvalidArgument,
               {(*paths)[1], "shard 2 of 3", "open the first shard", (*paths)[0]});
}

TEST_F(GgufSplit, RenamedFirstShardCannotFindTheOthers) {
  auto single = File::open(write_model("m.gguf"));
  auto paths = test::write_gguf_split(*single, at("m"), 3);
  ASSERT_TRUE(paths.is_ok());
  fs::rename((*paths)[0], at("renamed.gguf"));
  expect_error(File::open(at("renamed.gguf")), ErrorCode::kInvalidArgument,
               {at("renamed.gguf"), "split.count", "-00001-of-00003.gguf"});
}

TEST_F(GgufSplit, CorruptShardNamesIt) {
  auto single = File::open(write_model("m.gguf"));
  auto paths = test::write_gguf_split(*single, at("m"), 3);
  ASSERT_TRUE(paths.is_ok());
  fs::resize_file((*paths)[1], fs::file_size((*paths)[1]) - 100);  // cuts into the last tensor
  expect_error(File::open((*paths)[0]), ErrorCode::kCorruptFile,
               {(*paths)[1], "truncated", "shard 2 of 3 of " + (*paths)[0]});
  // Garbage instead of a GGUF.
  std::ofstream((*paths)[1], std::ios::binary | std::ios::trunc) << "not a gguf file at all, just text";
  expect_error(File::open((*paths)[0]), ErrorCode::kCorruptFile, {(*paths)[1], "magic"});
}

// Shards of two different models (same naming, same count) mixed: one of the checks catches it.
TEST_F(GgufSplit, ForeignShardIsRejected) {
  auto a = File::open(write_model("a.gguf", "a"));
  ASSERT_TRUE(a.is_ok());
  // Model b has one tensor more: split.tensors.count differs.
  Writer w;
  w.add("general.architecture", Value::str("llama"));
  std::vector<std::vector<uint8_t>> data;
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(w.add_tensor("blk." + std::to_string(i) + ".attn_norm.weight", Type::kF32, {32}).is_ok());
    data.emplace_back(128, uint8_t(i));
  }
  ASSERT_TRUE(w.write(at("b.gguf"), data).is_ok());
  auto b = File::open(at("b.gguf"));
  ASSERT_TRUE(b.is_ok());
  auto pa = test::write_gguf_split(*a, at("a"), 3);
  auto pb = test::write_gguf_split(*b, at("b"), 3);
  ASSERT_TRUE(pa.is_ok() && pb.is_ok());
  fs::copy_file((*pb)[1], (*pa)[1], fs::copy_options::overwrite_existing);
  expect_error(File::open((*pa)[0]), ErrorCode::kCorruptFile,
               {(*pa)[1], "split.tensors.count", "8", "7", "another model"});

  // Model c: the same 7 tensor names as a, split the same way, but from a 2-shard split: its
  // split.count differs.
  auto pc = test::write_gguf_split(*a, at("c"), 4);
  ASSERT_TRUE(pc.is_ok());
  ASSERT_EQ(pc->size(), 2u);
  pa = test::write_gguf_split(*a, at("a"), 3);
  fs::copy_file((*pc)[1], (*pa)[1], fs::copy_options::overwrite_existing);
  expect_error(File::open((*pa)[0]), ErrorCode::kCorruptFile, {(*pa)[1], "split.count", "2", "3"});

  // Shard 3 replaced by shard 2 (right count, wrong position): split.no says so.
  pa = test::write_gguf_split(*a, at("a"), 3);
  fs::copy_file((*pa)[1], (*pa)[2], fs::copy_options::overwrite_existing);
  expect_error(File::open((*pa)[0]), ErrorCode::kCorruptFile, {(*pa)[2], "split.no", "1", "expected 2"});
}

// Shard sets held in memory (the fuzzer's entry point): the checks that need crafted metadata.
std::vector<uint8_t> shard_bytes(const std::vector<KeyValue>& kv, const std::vector<std::string>& tensors) {
  Writer w;
  for (const auto& e : kv) w.add(e.key, e.value);
  for (const auto& t : tensors) EXPECT_TRUE(w.add_tensor(t, Type::kF32, {8}).is_ok());
  auto h = w.header_bytes();
  EXPECT_TRUE(h.is_ok());
  std::vector<uint8_t> out = std::move(h).value();
  out.resize(out.size() + w.tensors().size() * 32, 0);
  return out;
}
std::vector<KeyValue> split_keys(uint16_t no, uint16_t count, int32_t tensors) {
  return {{std::string(kSplitNo), Value::u16(no)},
          {std::string(kSplitCount), Value::u16(count)},
          {std::string(kSplitTensorsCount), Value::i32(tensors)}};
}
Result<File> parse_set(const std::vector<std::vector<uint8_t>>& bytes) {
  std::vector<ShardBytes> s;
  for (size_t k = 0; k < bytes.size(); ++k) {
    std::string name = "s";
    name += std::to_string(k);
    s.push_back({bytes[k].data(), bytes[k].size(), name});
  }
  return File::parse_shards(s);
}

TEST(GgufSplitMemory, ChecksThatNeedCraftedMetadata) {
  const auto s0 = shard_bytes(split_keys(0, 2, 3), {"a", "b"});
  const auto s1 = shard_bytes(split_keys(1, 2, 3), {"c"});
  auto ok = parse_set({s0, s1});
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  EXPECT_EQ(ok->tensors().size(), 3u);
  EXPECT_EQ(ok->find_tensor("c")->shard, 1u);

  // A tensor in two shards.
  expect_error(parse_set({s0, shard_bytes(split_keys(1, 2, 3), {"a"})}), ErrorCode::kCorruptFile,
               {"s1", "tensor 'a'", "also in s0"});
  // Fewer tensors than split.tensors.count promises.
  expect_error(parse_set({shard_bytes(split_keys(0, 2, 4), {"a", "b"}), shard_bytes(split_keys(1, 2, 4), {"c"})}),
               ErrorCode::kCorruptFile, {"s0", "split.tensors.count", "4", "3 tensors"});
  // Count against the shards given.
  expect_error(parse_set({s0}), ErrorCode::kCorruptFile, {"s0", "split.count", "2 shards, but 1 given"});
  expect_error(parse_set({s0, s1, s1}), ErrorCode::kCorruptFile, {"s0", "split.count"});
  // Split keys missing from a later shard, or of the wrong type, or out of range.
  expect_error(parse_set({s0, shard_bytes({}, {"c"})}), ErrorCode::kCorruptFile, {"s1", "split.count", "missing"});
  expect_error(parse_set({s0, shard_bytes({{std::string(kSplitNo), Value::u16(1)},
                                           {std::string(kSplitCount), Value::str("2")},
                                           {std::string(kSplitTensorsCount), Value::i32(3)}},
                                          {"c"})}),
               ErrorCode::kCorruptFile, {"s1", "split.count", "string"});
  expect_error(parse_set({shard_bytes(split_keys(2, 2, 3), {"a"}), s1}), ErrorCode::kCorruptFile,
               {"s0", "split.no", "not below"});
  expect_error(parse_set({shard_bytes(split_keys(0, 0, 3), {"a"})}), ErrorCode::kCorruptFile,
               {"s0", "split.count", "outside"});
  expect_error(parse_set({shard_bytes(split_keys(0, 2, -1), {"a"}), s1}), ErrorCode::kCorruptFile,
               {"s0", "split.tensors.count", "negative"});
  // The first entry is shard 2.
  expect_error(parse_set({s1, s0}), ErrorCode::kInvalidArgument, {"s0: is shard 2 of 2"});
  // A corrupt shard is reported by its own name.
  auto bad = s1;
  bad.resize(bad.size() - 1);
  expect_error(parse_set({s0, bad}), ErrorCode::kCorruptFile, {"s1", "truncated"});
}

}  // namespace
}  // namespace sluice::gguf
