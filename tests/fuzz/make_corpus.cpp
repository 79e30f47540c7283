// Writes the fuzzer's seed corpus: small valid GGUF files covering every value type, nested
// arrays, tensors of several formats and alignments, plus truncated and byte-flipped variants,
// and shard sets of a split model (gguf_fuzz.cpp's "GSPL" inputs).
// Usage: gguf_make_corpus DIR   (the committed corpus is tests/fuzz/corpus/)
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace {

using sluice::gguf::Value;
using sluice::gguf::ValueType;
using sluice::gguf::Writer;
using sluice::quant::Type;

std::vector<uint8_t> render(const Writer& w, uint64_t seed) {
  auto header = w.header_bytes();
  if (!header.is_ok()) {
    std::fprintf(stderr, "%s\n", header.status().message().c_str());
    std::exit(1);
  }
  std::vector<uint8_t> out = std::move(header).value();
  const size_t start = out.size();
  std::mt19937_64 rng(seed);
  for (const auto& t : w.tensors()) {
    out.resize(start + t.offset + t.nbytes, 0);
    for (uint64_t i = 0; i < t.nbytes; ++i) out[start + t.offset + i] = static_cast<uint8_t>(rng());
  }
  return out;
}

void save(const std::string& dir, const std::string& name, const std::vector<uint8_t>& bytes) {
  std::ofstream(dir + "/" + name, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                          static_cast<std::streamsize>(bytes.size()));
}

Writer every_value_type() {
  Writer w;
  w.add("general.architecture", Value::str("llama"));
  w.add("a.u8", Value::u8(1));
  w.add("a.i8", Value::i8(-1));
  w.add("a.u16", Value::u16(2));
  w.add("a.i16", Value::i16(-2));
  w.add("a.u32", Value::u32(3));
  w.add("a.i32", Value::i32(-3));
  w.add("a.u64", Value::u64(4));
  w.add("a.i64", Value::i64(-4));
  w.add("a.f32", Value::f32(0.5f));
  w.add("a.f64", Value::f64(0.25));
  w.add("a.bool", Value::boolean(true));
  w.add("a.str", Value::str("text"));
  w.add("a.arr.str", Value::string_array({"a", "bc", ""}));
  w.add("a.arr.f32", Value::f32_array({1.0f, 2.0f}));
  w.add("a.arr.i32", Value::i32_array({1, -1}));
  w.add("a.arr.nested", Value::array(ValueType::kArray, {Value::i32_array({1}), Value::i32_array({})}));
  return w;
}

Writer model_like(uint64_t alignment) {
  Writer w(alignment);
  w.add("general.architecture", Value::str("llama"));
  w.add("llama.block_count", Value::u32(1));
  w.add("llama.embedding_length", Value::u32(256));
  w.add("tokenizer.ggml.model", Value::str("gpt2"));
  w.add("tokenizer.ggml.tokens", Value::string_array({"a", "b", "ab"}));
  w.add("tokenizer.ggml.merges", Value::string_array({"a b"}));
  const std::pair<const char*, Type> tensors[] = {
      {"token_embd.weight", Type::kQ4_K}, {"blk.0.attn_norm.weight", Type::kF32}, {"blk.0.attn_q.weight", Type::kQ8_0},
      {"blk.0.ffn_down.weight", Type::kQ6_K}, {"output.weight", Type::kF16}};
  for (const auto& [name, type] : tensors) {
    std::vector<uint64_t> shape{256};
    if (type != Type::kF32) shape.push_back(2);
    if (!w.add_tensor(name, type, shape).is_ok()) std::exit(1);
  }
  return w;
}

// A split model's shards as gguf-split writes them: the first carries the metadata, every shard
// split.no, split.tensors.count, split.count; `groups` tensors (model_like's) per shard.
std::vector<std::vector<uint8_t>> split_model(const std::vector<int>& groups, uint64_t seed) {
  const Writer whole = model_like(32);
  const auto& all = whole.tensors();
  std::vector<std::vector<uint8_t>> out;
  size_t next = 0;
  for (size_t k = 0; k < groups.size(); ++k) {
    Writer w;
    if (k == 0) {
      for (const auto& kv : whole.metadata()) w.add(kv.key, kv.value);
    }
    w.add("split.no", Value::u16(static_cast<uint16_t>(k)));
    w.add("split.tensors.count", Value::i32(static_cast<int32_t>(all.size())));
    w.add("split.count", Value::u16(static_cast<uint16_t>(groups.size())));
    for (int i = 0; i < groups[k] && next < all.size(); ++i, ++next) {
      if (!w.add_tensor(all[next].name, all[next].type, all[next].shape).is_ok()) std::exit(1);
    }
    out.push_back(render(w, seed + k));
  }
  return out;
}

// The fuzzer's shard-set input: "GSPL", u8 count, u32 lengths of all but the last, the bytes.
std::vector<uint8_t> shard_set(const std::vector<std::vector<uint8_t>>& shards) {
  std::vector<uint8_t> out = {'G', 'S', 'P', 'L', static_cast<uint8_t>(shards.size() - 1)};
  for (size_t k = 0; k + 1 < shards.size(); ++k) {
    const auto n = static_cast<uint32_t>(shards[k].size());
    const auto* p = reinterpret_cast<const uint8_t*>(&n);
    out.insert(out.end(), p, p + 4);
  }
  for (const auto& s : shards) out.insert(out.end(), s.begin(), s.end());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: gguf_make_corpus DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  Writer empty;
  empty.add("general.architecture", Value::str("llama"));
  save(dir, "empty.gguf", render(empty, 1));

  const auto values = render(every_value_type(), 2);
  save(dir, "values.gguf", values);

  Writer small;
  small.add("k", Value::u32(1));
  for (Type t : {Type::kF32, Type::kF16, Type::kBF16, Type::kQ4_0, Type::kQ4_1, Type::kQ5_0, Type::kQ5_1,
                 Type::kQ8_0, Type::kQ2_K, Type::kQ3_K, Type::kQ4_K, Type::kQ5_K, Type::kQ6_K}) {
    const auto& tt = sluice::quant::traits(t);
    if (!small.add_tensor(std::string("t.") + tt.name, t, {static_cast<uint64_t>(tt.block_elems)}).is_ok()) return 1;
  }
  save(dir, "every_type.gguf", render(small, 3));

  const auto model32 = render(model_like(32), 4);
  save(dir, "model_align32.gguf", model32);
  save(dir, "model_align64.gguf", render(model_like(64), 5));

  // Damaged variants: truncated inside the metadata and inside the data; flipped bytes.
  save(dir, "values_truncated.gguf", std::vector<uint8_t>(values.begin(), values.begin() + values.size() / 2));
  save(dir, "model_truncated.gguf", std::vector<uint8_t>(model32.begin(), model32.end() - 100));
  std::mt19937_64 rng(6);
  for (int i = 0; i < 4; ++i) {
    auto b = model32;
    for (int k = 0; k < 3; ++k) b[rng() % 600] ^= static_cast<uint8_t>(1u << (rng() % 8));
    save(dir, "model_flipped" + std::to_string(i) + ".gguf", b);
  }

  // Shard sets (split models): valid 3- and 2-shard splits, the shards out of order, one missing.
  const auto three = split_model({2, 2, 1}, 7);
  save(dir, "split3.gguf", shard_set(three));
  save(dir, "split2.gguf", shard_set(split_model({3, 2}, 8)));
  save(dir, "split3_swapped.gguf", shard_set({three[0], three[2], three[1]}));
  save(dir, "split3_missing.gguf", shard_set({three[0], three[1]}));
  return 0;
}
