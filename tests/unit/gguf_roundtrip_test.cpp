// Writer -> reader round trips: every value type (nested arrays included), many tensors of
// every format, custom alignment, chunked streaming, and the writer's own input validation.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "gguf/gguf.h"
#include "test_util.h"

namespace sluice::gguf {
namespace {

using quant::Type;

std::string temp_path(const std::string& tag) {
  return (std::filesystem::temp_directory_path() /
          ("sluice_gguf_" + tag + "_" + std::to_string(::getpid()) + ".gguf")).string();
}

struct TempFile {
  explicit TempFile(const std::string& tag) : path(temp_path(tag)) {}
  ~TempFile() { std::filesystem::remove(path); }
  std::string path;
};

std::vector<KeyValue> every_value_type() {
  std::vector<KeyValue> kv;
  kv.push_back({"t.u8", Value::u8(250)});
  kv.push_back({"t.i8", Value::i8(-128)});
  kv.push_back({"t.u16", Value::u16(65535)});
  kv.push_back({"t.i16", Value::i16(-32768)});
  kv.push_back({"t.u32", Value::u32(0xFFFFFFFFu)});
  kv.push_back({"t.i32", Value::i32(std::numeric_limits<int32_t>::min())});
  kv.push_back({"t.u64", Value::u64(std::numeric_limits<uint64_t>::max())});
  kv.push_back({"t.i64", Value::i64(std::numeric_limits<int64_t>::min())});
  kv.push_back({"t.f32", Value::f32(-1.5e-7f)});
  kv.push_back({"t.f32.inf", Value::f32(std::numeric_limits<float>::infinity())});
  kv.push_back({"t.f64", Value::f64(3.141592653589793)});
  kv.push_back({"t.bool.true", Value::boolean(true)});
  kv.push_back({"t.bool.false", Value::boolean(false)});
  kv.push_back({"t.string", Value::str("hello, \xc4\x9f\xe2\x82\xac world")});
  kv.push_back({"t.string.empty", Value::str("")});
  kv.push_back({"t.string.nul", Value::str(std::string("a\0b", 3))});
  kv.push_back({"t.arr.empty", Value::array(ValueType::kU32, {})});
  kv.push_back({"t.arr.strings", Value::string_array({"a", "", "ccc"})});
  kv.push_back({"t.arr.f32", Value::f32_array({1.0f, -2.0f, 0.5f})});
  kv.push_back({"t.arr.i32", Value::i32_array({-1, 0, 7})});
  kv.push_back({"t.arr.bool", Value::array(ValueType::kBool, {Value::boolean(true), Value::boolean(false)})});
  kv.push_back({"t.arr.u8", Value::array(ValueType::kU8, {Value::u8(0), Value::u8(255)})});
  kv.push_back({"t.arr.i64", Value::array(ValueType::kI64, {Value::i64(-5), Value::i64(1ll << 60)})});
  kv.push_back({"t.arr.f64", Value::array(ValueType::kF64, {Value::f64(1e300), Value::f64(-0.0)})});
  kv.push_back({"t.arr.u16", Value::array(ValueType::kU16, {Value::u16(1)})});
  kv.push_back({"t.arr.i16", Value::array(ValueType::kI16, {Value::i16(-2)})});
  kv.push_back({"t.arr.i8", Value::array(ValueType::kI8, {Value::i8(-3)})});
  kv.push_back({"t.arr.u64", Value::array(ValueType::kU64, {Value::u64(42)})});
  // Nested: array of arrays of strings, and three levels of i32 arrays with an empty inner one.
  kv.push_back({"t.nested.strings", Value::array(ValueType::kArray, {Value::string_array({"x", "y"}),
                                                                     Value::string_array({})})});
  kv.push_back({"t.nested.deep",
                Value::array(ValueType::kArray,
                             {Value::array(ValueType::kArray, {Value::i32_array({1, 2}), Value::i32_array({})}),
                              Value::array(ValueType::kArray, {})})});
  return kv;
}

TEST(GgufRoundTrip, EveryValueType) {
  Writer w;
  auto kvs = every_value_type();
  for (const auto& kv : kvs) w.add(kv.key, kv.value);
  ASSERT_TRUE(w.add_tensor("t", Type::kF32, {8}).is_ok());
  TempFile tmp("values");
  ASSERT_TRUE(w.write(tmp.path, std::vector<std::vector<uint8_t>>{std::vector<uint8_t>(32, 7)}).is_ok());
  auto r = File::open(tmp.path);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->version(), 3u);
  ASSERT_EQ(r->metadata().size(), kvs.size());
  for (size_t i = 0; i < kvs.size(); ++i) {
    EXPECT_EQ(r->metadata()[i].key, kvs[i].key);  // order preserved
    EXPECT_TRUE(r->metadata()[i].value == kvs[i].value) << kvs[i].key;
  }
  EXPECT_EQ(r->get_uint("t.u64").value(), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(r->get_int("t.i64").value(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(r->get_int("t.u8").value(), 250);
  EXPECT_EQ(r->get_uint("t.i8").status().code(), ErrorCode::kCorruptFile);  // negative
  EXPECT_FALSE(r->get_int("t.u64").is_ok());                                // > INT64_MAX
  EXPECT_FLOAT_EQ(static_cast<float>(r->get_float("t.f32").value()), -1.5e-7f);
  EXPECT_TRUE(std::isinf(r->get_float("t.f32.inf").value()));
  EXPECT_DOUBLE_EQ(r->get_float("t.u16").value(), 65535.0);
  EXPECT_TRUE(r->get_bool("t.bool.true").value());
  EXPECT_FALSE(r->get_bool("t.bool.false").value());
  EXPECT_EQ(r->get_string("t.string.nul").value(), std::string("a\0b", 3));
  const Value* deep = r->find("t.nested.deep");
  ASSERT_NE(deep, nullptr);
  ASSERT_EQ(deep->items.size(), 2u);
  EXPECT_EQ(deep->items[0].items[0].items[1].i, 2);
  EXPECT_EQ(deep->items[0].items[0].elem_type, ValueType::kI32);
  // A value that differs must compare unequal (so the loop above can fail).
  EXPECT_FALSE(Value::u32(1) == Value::u64(1));
  EXPECT_FALSE(Value::string_array({"x"}) == Value::string_array({"y"}));
}

// Bytes of a random tensor of any format: only sizes matter to the container.
std::vector<uint8_t> random_bytes(size_t n, uint64_t salt) {
  std::mt19937_64 rng(test::test_seed() ^ salt);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

void round_trip_many_tensors(uint64_t alignment, uint64_t chunk_bytes) {
  const Type kTypes[] = {Type::kF32, Type::kF16, Type::kBF16, Type::kQ4_0, Type::kQ4_1, Type::kQ5_0, Type::kQ5_1,
                         Type::kQ8_0, Type::kQ2_K, Type::kQ3_K, Type::kQ4_K, Type::kQ5_K, Type::kQ6_K};
  std::mt19937_64 rng(test::test_seed() + alignment);
  Writer w(alignment);
  w.set_chunk_bytes(chunk_bytes);
  w.add("general.architecture", Value::str("test"));
  std::vector<std::vector<uint8_t>> data;
  for (int i = 0; i < 300; ++i) {
    const Type t = kTypes[i % std::size(kTypes)];
    const uint64_t block = static_cast<uint64_t>(quant::traits(t).block_elems);
    std::vector<uint64_t> shape{block * (1 + rng() % 3)};
    const int extra_dims = static_cast<int>(rng() % 4);
    for (int d = 0; d < extra_dims; ++d) shape.push_back(1 + rng() % 5);
    ASSERT_TRUE(w.add_tensor("blk." + std::to_string(i) + ".w", t, shape).is_ok());
    data.push_back(random_bytes(w.tensors().back().nbytes, static_cast<uint64_t>(i)));
  }
  TempFile tmp("tensors" + std::to_string(alignment));
  // Chunks must be whole rows, in order, covering each tensor exactly once.
  std::vector<uint64_t> next(data.size(), 0);
  Status st = w.write(tmp.path, [&](size_t index, uint64_t offset, uint8_t* dst, uint64_t nbytes) -> Status {
    const TensorInfo& info = w.tensors()[index];
    if (offset != next[index]) return internal_error("chunk out of order");
    if (offset % info.row_bytes() != 0 || nbytes % info.row_bytes() != 0) return internal_error("partial row");
    next[index] += nbytes;
    std::memcpy(dst, data[index].data() + offset, nbytes);
    return Status::ok();
  });
  ASSERT_TRUE(st.is_ok()) << st.message();
  for (size_t i = 0; i < data.size(); ++i) ASSERT_EQ(next[i], data[i].size());
  EXPECT_EQ(std::filesystem::file_size(tmp.path), w.file_bytes());

  auto r = File::open(tmp.path);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->alignment(), alignment);
  EXPECT_EQ(r->data_offset() % alignment, 0u);
  if (alignment != kDefaultAlignment) { EXPECT_EQ(r->get_uint("general.alignment").value(), alignment); }
  ASSERT_EQ(r->tensors().size(), data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    const TensorInfo& got = r->tensors()[i];
    const TensorInfo& want = w.tensors()[i];
    EXPECT_EQ(got.name, want.name);
    EXPECT_EQ(got.type, want.type);
    EXPECT_EQ(got.shape, want.shape);
    EXPECT_EQ(got.offset, want.offset);
    EXPECT_EQ(got.offset % alignment, 0u);
    ASSERT_EQ(got.nbytes, data[i].size());
    ASSERT_EQ(std::memcmp(r->tensor_data(got), data[i].data(), got.nbytes), 0) << got.name;
    EXPECT_EQ(r->find_tensor(want.name), &got);
  }
}

TEST(GgufRoundTrip, ManyTensorsDefaultAlignment) { round_trip_many_tensors(32, 64ull << 20); }
TEST(GgufRoundTrip, ManyTensorsSmallChunks) { round_trip_many_tensors(32, 100); }
TEST(GgufRoundTrip, ManyTensorsAlignment4096) { round_trip_many_tensors(4096, 1000); }
TEST(GgufRoundTrip, ManyTensorsAlignment1) { round_trip_many_tensors(1, 333); }

TEST(GgufRoundTrip, NoTensors) {
  Writer w;
  w.add("general.architecture", Value::str("none"));
  TempFile tmp("empty");
  ASSERT_TRUE(w.write(tmp.path, std::vector<std::vector<uint8_t>>{}).is_ok());
  auto r = File::open(tmp.path);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_TRUE(r->tensors().empty());
  EXPECT_EQ(r->get_string("general.architecture").value(), "none");
}

TEST(GgufWriter, FillErrorRemovesFile) {
  Writer w;
  ASSERT_TRUE(w.add_tensor("a", Type::kF32, {4}).is_ok());
  TempFile tmp("fillerr");
  Status st = w.write(tmp.path, [](size_t, uint64_t, uint8_t*, uint64_t) { return io_error("generator failed"); });
  EXPECT_FALSE(st.is_ok());
  EXPECT_EQ(st.message(), "generator failed");
  EXPECT_FALSE(std::filesystem::exists(tmp.path));
}

TEST(GgufWriter, UnwritablePathIsIoError) {
  Writer w;
  Status st = w.write("/nonexistent/dir/x.gguf", std::vector<std::vector<uint8_t>>{});
  EXPECT_EQ(st.code(), ErrorCode::kIo);
  EXPECT_NE(st.message().find("/nonexistent/dir/x.gguf"), std::string::npos);
}

TEST(GgufWriter, RejectsInvalidTensors) {
  Writer w;
  ASSERT_TRUE(w.add_tensor("a", Type::kQ4_K, {256, 2}).is_ok());
  EXPECT_NE(w.add_tensor("a", Type::kF32, {1}).message().find("duplicate"), std::string::npos);
  EXPECT_NE(w.add_tensor("b", Type::kQ4_K, {128}).message().find("multiple"), std::string::npos);
  EXPECT_FALSE(w.add_tensor("c", Type::kF32, {}).is_ok());
  EXPECT_FALSE(w.add_tensor("c", Type::kF32, {1, 1, 1, 1, 1}).is_ok());
  EXPECT_FALSE(w.add_tensor("c", Type::kF32, {4, 0}).is_ok());
  EXPECT_FALSE(w.add_tensor("c", Type::kF32, {1ull << 32, 1ull << 32}).is_ok());
  EXPECT_FALSE(w.add_tensor("", Type::kF32, {1}).is_ok());
  EXPECT_FALSE(w.add_tensor(std::string(64, 'n'), Type::kF32, {1}).is_ok());
  EXPECT_TRUE(w.add_tensor(std::string(63, 'n'), Type::kF32, {1}).is_ok());
  EXPECT_EQ(w.tensors().size(), 2u);
}

TEST(GgufWriter, RejectsInconsistentMetadata) {
  TempFile tmp("badmeta");
  {
    Writer w;
    w.add("k", Value::array(ValueType::kU32, {Value::u32(1), Value::str("x")}));
    Status st = w.write(tmp.path, std::vector<std::vector<uint8_t>>{});
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(st.message().find("'k'"), std::string::npos) << st.message();
  }
  {
    Writer w(64);
    w.add("general.alignment", Value::u32(32));
    EXPECT_FALSE(w.write(tmp.path, std::vector<std::vector<uint8_t>>{}).is_ok());
  }
  {
    Writer w(48);
    EXPECT_FALSE(w.write(tmp.path, std::vector<std::vector<uint8_t>>{}).is_ok());
  }
  {
    Writer w;
    ASSERT_TRUE(w.add_tensor("a", Type::kF32, {4}).is_ok());
    EXPECT_FALSE(w.write(tmp.path, std::vector<std::vector<uint8_t>>{std::vector<uint8_t>(15)}).is_ok());
  }
}

TEST(GgufWriter, AddReplacesExistingKey) {
  Writer w;
  w.add("a", Value::u32(1));
  w.add("a", Value::u32(2));
  ASSERT_EQ(w.metadata().size(), 1u);
  EXPECT_EQ(w.metadata()[0].value.u, 2u);
}

}  // namespace
}  // namespace sluice::gguf
