// Hostile and damaged inputs: each must yield a Status naming the file, the field and the
// offending value, never a crash or a huge allocation. Files are built byte by byte here (not by
// our writer) so the reader is checked against the format, and fields are patched by position.
#include <cstring>
#include <limits>
#include <map>

#include "gguf/gguf.h"
#include "test_util.h"

namespace sluice::gguf {
namespace {

constexpr unsigned long long kU64Max = ~0ull;
const char* const kName = "corrupt.gguf";

class Raw {
 public:
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  void mark(const std::string& name) { at[name] = bytes.size(); }
  template <typename T>
  void patch(const std::string& name, T v) {
    ASSERT_TRUE(at.count(name)) << name;
    std::memcpy(bytes.data() + at.at(name), &v, sizeof(T));
  }
  void pad_to(uint64_t a) { bytes.resize((bytes.size() + a - 1) / a * a, 0); }
  std::vector<uint8_t> bytes;
  std::map<std::string, size_t> at;
};

struct Spec {
  std::vector<std::string> keys{"general.architecture", "general.alignment", "tok.tokens", "t.nested"};
  std::vector<std::string> names{"tok_embd.weight", "norm.weight", "blk.0.w"};
};

// A valid v3 file: 4 key/values (string, u32 alignment, string array, nested i32 arrays) and
// 3 tensors: Q8_0 [64, 4] (272 bytes at 0), F32 [64] (256 bytes at 288), Q4_K [256, 2]
// (288 bytes at 544). The last tensor ends exactly at end of file, so every proper prefix of
// the file is invalid.
Raw base_file(const Spec& spec = {}) {
  Raw r;
  r.put<uint32_t>(0x46554747);
  r.mark("version");
  r.put<uint32_t>(3);
  r.mark("n_tensors");
  r.put<uint64_t>(3);
  r.mark("n_kv");
  r.put<uint64_t>(4);

  r.mark("kv0.key_len");
  r.str(spec.keys[0]);
  r.mark("kv0.type");
  r.put<uint32_t>(8);
  r.mark("kv0.str_len");
  r.str("llama");

  r.mark("kv1.key_len");
  r.str(spec.keys[1]);
  r.mark("kv1.type");
  r.put<uint32_t>(4);
  r.mark("kv1.value");
  r.put<uint32_t>(32);

  r.mark("kv2.key_len");
  r.str(spec.keys[2]);
  r.put<uint32_t>(9);
  r.mark("kv2.elem_type");
  r.put<uint32_t>(8);
  r.mark("kv2.count");
  r.put<uint64_t>(3);
  r.str("a");
  r.mark("kv2.item1.len");
  r.str("bb");
  r.str("ccc");

  r.mark("kv3.key_len");
  r.str(spec.keys[3]);
  r.put<uint32_t>(9);
  r.mark("kv3.elem_type");
  r.put<uint32_t>(9);
  r.put<uint64_t>(2);
  r.mark("kv3.inner0.elem_type");
  r.put<uint32_t>(5);
  r.mark("kv3.inner0.count");
  r.put<uint64_t>(2);
  r.put<int32_t>(1);
  r.put<int32_t>(2);
  r.put<uint32_t>(5);
  r.put<uint64_t>(1);
  r.put<int32_t>(3);

  struct T {
    std::vector<uint64_t> shape;
    uint32_t type;
    uint64_t offset;
  };
  const T tensors[] = {{{64, 4}, 8, 0}, {{64}, 0, 288}, {{256, 2}, 12, 544}};
  for (int i = 0; i < 3; ++i) {
    const std::string p = "t" + std::to_string(i);
    r.mark(p + ".name_len");
    r.str(spec.names[i]);
    r.mark(p + ".n_dims");
    r.put<uint32_t>(static_cast<uint32_t>(tensors[i].shape.size()));
    for (size_t d = 0; d < tensors[i].shape.size(); ++d) {
      r.mark(p + ".ne" + std::to_string(d));
      r.put<uint64_t>(tensors[i].shape[d]);
    }
    r.mark(p + ".type");
    r.put<uint32_t>(tensors[i].type);
    r.mark(p + ".offset");
    r.put<uint64_t>(tensors[i].offset);
  }
  r.mark("header_end");
  r.pad_to(32);
  r.mark("data");
  std::mt19937_64 rng(test::test_seed());
  for (int i = 0; i < 832; ++i) r.bytes.push_back(static_cast<uint8_t>(rng()));
  return r;
}

Result<File> parse(const std::vector<uint8_t>& bytes) {
  // An exact-size heap copy, so an out-of-bounds read is caught by AddressSanitizer.
  std::vector<uint8_t> exact(bytes.begin(), bytes.end());
  return File::parse(exact.data(), exact.size(), kName);
}

// Expects a failure whose message starts with the file name and contains every fragment.
void expect_error(const std::vector<uint8_t>& bytes, std::initializer_list<std::string> fragments,
                  ErrorCode code = ErrorCode::kCorruptFile) {
  auto r = parse(bytes);
  ASSERT_FALSE(r.is_ok()) << "parsed, expected an error containing " << *fragments.begin();
  const std::string& m = r.status().message();
  EXPECT_EQ(r.status().code(), code) << m;
  EXPECT_EQ(m.rfind(std::string(kName) + ": ", 0), 0u) << m;
  for (const auto& f : fragments) EXPECT_NE(m.find(f), std::string::npos) << "'" << f << "' not in: " << m;
}

TEST(GgufCorrupt, BaseFileIsValid) {
  Raw r = base_file();
  auto f = parse(r.bytes);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  EXPECT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->data_offset(), r.at["data"]);
  EXPECT_EQ(f->find_tensor("blk.0.w")->nbytes, 288u);
  EXPECT_EQ(f->find("t.nested")->items[1].items[0].i, 3);
  // Version 2 has the same layout.
  r.patch<uint32_t>("version", 2);
  EXPECT_TRUE(parse(r.bytes).is_ok());
}

TEST(GgufCorrupt, TruncatedAtEveryByte) {
  const Raw r = base_file();
  for (size_t len = 0; len < r.bytes.size(); ++len) {
    std::vector<uint8_t> prefix(r.bytes.begin(), r.bytes.begin() + static_cast<long>(len));
    auto f = parse(prefix);
    ASSERT_FALSE(f.is_ok()) << "prefix of " << len << " bytes parsed";
    const std::string& m = f.status().message();
    ASSERT_EQ(m.rfind(std::string(kName) + ": ", 0), 0u) << m;
    const bool says_why = m.find("truncated") != std::string::npos || m.find("cannot fit") != std::string::npos ||
                          m.find("exceeds") != std::string::npos || m.find("past the end") != std::string::npos;
    ASSERT_TRUE(says_why) << len << ": " << m;
  }
}

TEST(GgufCorrupt, TruncatedAtSectionBoundariesNamesTheField) {
  const Raw r = base_file();
  auto cut = [&](size_t len) { return std::vector<uint8_t>(r.bytes.begin(), r.bytes.begin() + static_cast<long>(len)); };
  expect_error(cut(0), {"header", "magic", "truncated"});
  expect_error(cut(6), {"header", "version", "truncated"});
  expect_error(cut(12), {"header", "n_tensors", "truncated"});
  expect_error(cut(20), {"header", "n_kv", "truncated"});
  // Early in the metadata, the count check sees that 4 key/values cannot fit what remains.
  expect_error(cut(r.at.at("kv0.key_len") + 3), {"header", "n_kv", "4 key/value pairs cannot fit", "truncated"});
  expect_error(cut(r.at.at("kv2.key_len") + 3), {"metadata[2]", "key length", "truncated"});
  expect_error(cut(r.at.at("kv2.key_len") + 8 + 4), {"metadata[2]", "key length", "exceeds"});
  expect_error(cut(r.at.at("kv1.type") + 1), {"header", "n_tensors", "3 tensor infos cannot fit", "truncated"});
  expect_error(cut(r.at.at("kv1.value") + 2), {"'general.alignment'", "value", "truncated"});
  expect_error(cut(r.at.at("kv2.elem_type") + 1), {"'tok.tokens'", "value element type", "truncated"});
  expect_error(cut(r.at.at("kv2.count") + 1), {"'tok.tokens'", "value count", "truncated"});
  expect_error(cut(r.at.at("kv2.item1.len") + 9), {"'tok.tokens'", "value count", "cannot fit"});
  expect_error(cut(r.at.at("kv3.inner0.count") + 8 + 4), {"'t.nested'", "value count", "cannot fit", "truncated"});
  expect_error(cut(r.at.at("t0.name_len") + 5), {"tensor[0]", "name length", "truncated"});
  expect_error(cut(r.at.at("t0.n_dims")), {"tensor 'tok_embd.weight'", "n_dims", "truncated"});
  expect_error(cut(r.at.at("t1.ne0") + 4), {"tensor 'norm.weight'", "ne[0]", "truncated"});
  expect_error(cut(r.at.at("t2.type")), {"tensor 'blk.0.w'", "type", "truncated"});
  expect_error(cut(r.at.at("t2.offset") + 7), {"tensor 'blk.0.w'", "offset", "truncated"});
  expect_error(cut(r.at.at("header_end")), {"data section", "past the end"});
  expect_error(cut(r.at.at("data") + 100), {"tensor 'tok_embd.weight'", "offset", "past the end", "truncated"});
  expect_error(cut(r.bytes.size() - 1), {"tensor 'blk.0.w'", "offset", "past the end"});
}

TEST(GgufCorrupt, BadMagic) {
  Raw r = base_file();
  r.patch<uint32_t>("version", 3);
  std::memcpy(r.bytes.data(), "GGML", 4);
  expect_error(r.bytes, {"magic", "0x4c4d4747", "GGUF"});
}

TEST(GgufCorrupt, UnsupportedVersions) {
  for (uint32_t v : {0u, 1u, 4u, 0xFFFFFFFFu}) {
    Raw r = base_file();
    r.patch<uint32_t>("version", v);
    expect_error(r.bytes, {"version", std::to_string(v) + " is not supported"}, ErrorCode::kUnsupported);
  }
  Raw r = base_file();
  r.patch<uint32_t>("version", 0x03000000);
  expect_error(r.bytes, {"version", "big-endian"}, ErrorCode::kUnsupported);
}

TEST(GgufCorrupt, AbsurdCounts) {
  for (uint64_t n : {kU64Max, 1ull << 63, 1ull << 40, 1000ull}) {
    Raw r = base_file();
    r.patch<uint64_t>("n_kv", n);
    expect_error(r.bytes, {"n_kv", std::to_string(n), "cannot fit"});
    r = base_file();
    r.patch<uint64_t>("n_tensors", n);
    expect_error(r.bytes, {"n_tensors", std::to_string(n), "cannot fit"});
  }
  // Plausible but wrong counts run into the next section and fail there.
  Raw r = base_file();
  r.patch<uint64_t>("n_kv", 5);
  EXPECT_FALSE(parse(r.bytes).is_ok());
  r = base_file();
  r.patch<uint64_t>("n_tensors", 4);
  EXPECT_FALSE(parse(r.bytes).is_ok());
}

TEST(GgufCorrupt, AbsurdStringLengths) {
  for (uint64_t n : {kU64Max, kU64Max - 7, 1ull << 63, 1ull << 32, 70000ull}) {
    Raw r = base_file();
    r.patch<uint64_t>("kv0.key_len", n);
    expect_error(r.bytes, {"metadata[0]", "key length", std::to_string(n)});
    r = base_file();
    r.patch<uint64_t>("kv0.str_len", n);
    expect_error(r.bytes, {"'general.architecture'", "value length", std::to_string(n), "exceeds"});
    r = base_file();
    r.patch<uint64_t>("kv2.item1.len", n);
    expect_error(r.bytes, {"'tok.tokens'", "length", std::to_string(n), "item 1"});
    r = base_file();
    r.patch<uint64_t>("t1.name_len", n);
    expect_error(r.bytes, {"tensor[1]", "name length", std::to_string(n), "limit of 63"});
  }
  // One byte more than remains.
  Raw r = base_file();
  const uint64_t remain = r.bytes.size() - r.at.at("kv0.str_len") - 8;
  r.patch<uint64_t>("kv0.str_len", remain + 1);
  expect_error(r.bytes, {"value length", std::to_string(remain + 1), std::to_string(remain) + " bytes remaining"});
}

TEST(GgufCorrupt, AbsurdArrayCounts) {
  for (uint64_t n : {kU64Max, 1ull << 62, 1ull << 61, 100000ull}) {
    Raw r = base_file();
    r.patch<uint64_t>("kv2.count", n);
    expect_error(r.bytes, {"'tok.tokens'", "value count", std::to_string(n), "cannot fit"});
    r = base_file();
    r.patch<uint64_t>("kv3.inner0.count", n);
    expect_error(r.bytes, {"'t.nested'", "count", std::to_string(n), "item 0"});
  }
}

TEST(GgufCorrupt, MetadataItemLimit) {
  // Bytes for the items exist, but the item count exceeds the per-file bound on metadata
  // items (each costs a Value in memory).
  Raw r;
  r.put<uint32_t>(0x46554747);
  r.put<uint32_t>(3);
  r.put<uint64_t>(0);
  r.put<uint64_t>(1);
  r.str("big");
  r.put<uint32_t>(9);
  r.put<uint32_t>(0);
  r.put<uint64_t>(kMaxMetadataItems + 1);
  r.bytes.resize(r.bytes.size() + kMaxMetadataItems + 1, 0);
  expect_error(r.bytes, {"'big'", "value count", std::to_string(kMaxMetadataItems + 1), "limit"});
}

TEST(GgufCorrupt, InvalidValueTypes) {
  for (uint32_t t : {13u, 100u, 0xFFFFFFFFu}) {
    Raw r = base_file();
    r.patch<uint32_t>("kv0.type", t);
    expect_error(r.bytes, {"'general.architecture'", "value type", "type id " + std::to_string(t)});
    r = base_file();
    r.patch<uint32_t>("kv2.elem_type", t);
    expect_error(r.bytes, {"'tok.tokens'", "element type", "type id " + std::to_string(t)});
    r = base_file();
    r.patch<uint32_t>("kv3.inner0.elem_type", t);
    expect_error(r.bytes, {"'t.nested'", "element type", std::to_string(t)});
  }
}

TEST(GgufCorrupt, ArraysNestedTooDeep) {
  Raw r;
  r.put<uint32_t>(0x46554747);
  r.put<uint32_t>(3);
  r.put<uint64_t>(0);
  r.put<uint64_t>(1);
  r.str("deep");
  r.put<uint32_t>(9);
  for (int i = 0; i < 10000; ++i) {  // deep enough to overflow the stack without a limit
    r.put<uint32_t>(9);
    r.put<uint64_t>(1);
  }
  expect_error(r.bytes, {"'deep'", "nested deeper than 8"});
}

TEST(GgufCorrupt, DuplicateAndEmptyKeys) {
  Spec s;
  s.keys[3] = "general.architecture";
  expect_error(base_file(s).bytes, {"metadata key 'general.architecture'", "duplicate key", "metadata[0]"});
  s = Spec();
  s.keys[2] = "";
  expect_error(base_file(s).bytes, {"metadata[2]", "key", "empty"});
}

TEST(GgufCorrupt, DuplicateAndBadTensorNames) {
  Spec s;
  s.names[2] = "norm.weight";
  expect_error(base_file(s).bytes, {"tensor 'norm.weight'", "duplicate tensor name", "tensor[1]"});
  s = Spec();
  s.names[0] = "";
  expect_error(base_file(s).bytes, {"tensor[0]", "name", "empty"});
  s = Spec();
  s.names[1] = std::string(64, 'x');
  expect_error(base_file(s).bytes, {"tensor[1]", "name length", "64", "limit of 63"});
}

TEST(GgufCorrupt, BadDims) {
  for (uint32_t n : {0u, 5u, 0xFFFFFFFFu}) {
    Raw r = base_file();
    r.patch<uint32_t>("t1.n_dims", n);
    expect_error(r.bytes, {"tensor 'norm.weight'", "n_dims", std::to_string(n) + " is outside 1..4"});
  }
  for (uint64_t ne : {0ull, 1ull << 63, kU64Max}) {
    Raw r = base_file();
    r.patch<uint64_t>("t0.ne1", ne);
    expect_error(r.bytes, {"tensor 'tok_embd.weight'", "ne[1]", std::to_string(ne)});
  }
}

TEST(GgufCorrupt, OverflowingShapes) {
  // 64 * 2^62 elements overflows int64.
  Raw r = base_file();
  r.patch<uint64_t>("t0.ne1", 1ull << 62);
  expect_error(r.bytes, {"tensor 'tok_embd.weight'", "shape", "[64, 4611686018427387904]", "overflows"});
  // F32 of 2^62 elements: the element count fits, the byte size (2^64) does not.
  r = base_file();
  r.patch<uint64_t>("t1.ne0", 1ull << 62);
  expect_error(r.bytes, {"tensor 'norm.weight'", "byte size", "overflows"});
  // Sizes that fit 64 bits but not the file.
  r = base_file();
  r.patch<uint64_t>("t1.ne0", 1ull << 40);
  expect_error(r.bytes, {"tensor 'norm.weight'", "offset", "past the end"});
}

TEST(GgufCorrupt, UnknownTypeIds) {
  for (uint32_t t : {4u, 5u, 16u, 29u, 99u, 0xFFFFFFFFu}) {
    Raw r = base_file();
    r.patch<uint32_t>("t1.type", t);
    expect_error(r.bytes, {"tensor 'norm.weight'", "type", "type id " + std::to_string(t)}, ErrorCode::kUnsupported);
  }
}

TEST(GgufCorrupt, RowNotMultipleOfBlock) {
  Raw r = base_file();
  r.patch<uint64_t>("t2.ne0", 128);
  expect_error(r.bytes, {"tensor 'blk.0.w'", "ne[0]", "128", "block size 256", "q4_k"});
  r = base_file();
  r.patch<uint64_t>("t0.ne0", 48);
  expect_error(r.bytes, {"tensor 'tok_embd.weight'", "ne[0]", "48", "block size 32"});
}

TEST(GgufCorrupt, TensorOffsets) {
  Raw r = base_file();
  r.patch<uint64_t>("t1.offset", 290);
  expect_error(r.bytes, {"tensor 'norm.weight'", "offset", "290", "alignment 32"});
  r = base_file();
  r.patch<uint64_t>("t2.offset", 576);  // aligned, but ends 32 bytes past the data
  expect_error(r.bytes, {"tensor 'blk.0.w'", "offset", "576", "past the end"});
  r = base_file();
  r.patch<uint64_t>("t2.offset", kU64Max - 31);  // offset + nbytes would wrap
  expect_error(r.bytes, {"tensor 'blk.0.w'", "offset", std::to_string(kU64Max - 31), "past the end"});
  r = base_file();
  r.patch<uint64_t>("t1.offset", 256);  // inside tok_embd.weight [0, 272)
  expect_error(r.bytes, {"tensor 'norm.weight'", "overlaps tensor 'tok_embd.weight'"});
  r = base_file();
  r.patch<uint64_t>("t2.offset", 0);
  expect_error(r.bytes, {"overlaps"});
}

TEST(GgufCorrupt, BadAlignment) {
  for (uint32_t a : {0u, 3u, 48u, 1u << 31}) {
    Raw r = base_file();
    r.patch<uint32_t>("kv1.value", a);
    expect_error(r.bytes, {"'general.alignment'", std::to_string(a), "power of two"});
  }
  Raw r = base_file();
  r.patch<uint32_t>("kv1.type", 5);  // i32
  expect_error(r.bytes, {"'general.alignment'", "i32", "unsigned"});
  r = base_file();
  r.patch<uint32_t>("kv1.value", 64);  // valid, but norm.weight at 288 is not 64-aligned
  expect_error(r.bytes, {"tensor 'norm.weight'", "288", "alignment 64"});
}

// Random byte damage anywhere: must never crash (AddressSanitizer/UBSan builds check reads).
TEST(GgufCorrupt, RandomMutationsNeverCrash) {
  const Raw base = base_file();
  std::mt19937_64 rng(test::test_seed());
  int failures = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::vector<uint8_t> b = base.bytes;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      const size_t pos = rng() % base.at.at("data");  // damage the header/metadata region
      b[pos] = (rng() % 2) ? static_cast<uint8_t>(rng()) : static_cast<uint8_t>(b[pos] ^ (1u << (rng() % 8)));
    }
    if (rng() % 4 == 0) b.resize(rng() % b.size());
    auto f = parse(b);
    if (!f.is_ok()) {
      ++failures;
      ASSERT_EQ(f.status().message().rfind(std::string(kName) + ": ", 0), 0u) << f.status().message();
    } else {
      for (const auto& t : f->tensors()) ASSERT_LE(f->data_offset() + t.offset + t.nbytes, b.size());
    }
  }
  EXPECT_GT(failures, 1000);  // most damage is detected
}

}  // namespace
}  // namespace sluice::gguf
