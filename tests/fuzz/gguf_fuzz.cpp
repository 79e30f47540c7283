// libFuzzer target for the GGUF reader: any input must parse to a File or fail with a Status
// whose message names the input; never crash, read out of bounds, hang or over-allocate.
// A parsed File is walked completely and checked against the reader's invariants, then
// rewritten by the Writer and re-parsed, which must reproduce the same metadata and tensors.
//
// Split models: an input starting with "GSPL" is a set of shards (File::parse_shards, the checks
// File::open applies to gguf-split's files): "GSPL", u8 n (1..4 shards), (n - 1) x u32 byte
// lengths of the first n - 1 shards, then the shards' bytes back to back (the last takes the
// rest). Each shard gets every single-file check; the set must be accepted only when its split
// keys agree (split.no = position, split.count = n, split.tensors.count = the tensors found)
// and no tensor name repeats, and each tensor's bytes must lie inside its own shard.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace {

using sluice::gguf::File;
using sluice::gguf::TensorInfo;
using sluice::gguf::Value;
using sluice::gguf::ValueType;
using sluice::gguf::Writer;

[[noreturn]] void violated(const char* what) {
  std::fprintf(stderr, "gguf_fuzz: invariant violated: %s\n", what);
  std::abort();
}

// Touches every byte of every value so the sanitizers see any dangling or uninitialized data.
uint64_t walk(const Value& v, int depth) {
  if (depth > static_cast<int>(sluice::gguf::kMaxArrayDepth)) violated("array depth above the limit");
  uint64_t h = static_cast<uint64_t>(v.type) + v.u + static_cast<uint64_t>(v.i);
  for (char c : v.s) h = h * 31 + static_cast<unsigned char>(c);
  if (v.type == ValueType::kArray) {
    for (const Value& item : v.items) {
      if (item.type != v.elem_type) violated("array item type differs from the element type");
      h += walk(item, depth + 1);
    }
  } else if (!v.items.empty()) {
    violated("scalar with items");
  }
  return h;
}

void check(const File& f, const uint8_t* data, size_t size) {
  volatile uint64_t sink = 0;
  for (const auto& kv : f.metadata()) {
    if (f.find(kv.key) != &kv.value) violated("find() does not return the key's value");
    sink = sink + walk(kv.value, 0);
    // Typed getters must answer (value or error), never crash.
    (void)f.get_uint(kv.key);
    (void)f.get_int(kv.key);
    (void)f.get_float(kv.key);
    (void)f.get_string(kv.key);
    (void)f.get_bool(kv.key);
  }
  if (f.alignment() == 0 || (f.alignment() & (f.alignment() - 1)) != 0) violated("alignment not a power of two");
  if (!f.tensors().empty() && f.data_offset() > size) violated("data offset past the end");
  for (const TensorInfo& t : f.tensors()) {
    if (f.find_tensor(t.name) != &t) violated("find_tensor() does not return the tensor");
    if (t.shape.empty() || t.shape.size() > sluice::gguf::kMaxDims) violated("bad n_dims accepted");
    if (t.offset % f.alignment() != 0) violated("misaligned offset accepted");
    if (f.data_offset() + t.offset + t.nbytes > size) violated("tensor past the end accepted");
    if (t.n_rows() * t.row_bytes() != t.nbytes) violated("nbytes != rows * row bytes");
    const uint8_t* p = f.tensor_data(t);
    if (p != data + f.data_offset() + t.offset) violated("tensor_data() points elsewhere");
    sink = sink + p[0] + p[t.nbytes - 1];
  }
}

// Rewrites the parsed file with the Writer (contiguous offsets) and parses it again.
void round_trip(const File& f) {
  const Value* align = f.find("general.alignment");
  if (align && align->type != ValueType::kU32) return;  // the Writer only emits the u32 form
  Writer w(f.alignment());
  for (const auto& kv : f.metadata()) w.add(kv.key, kv.value);
  for (const TensorInfo& t : f.tensors()) {
    if (!w.add_tensor(t.name, t.type, t.shape).is_ok()) violated("Writer rejects a tensor the reader accepted");
  }
  auto header = w.header_bytes();
  if (!header.is_ok()) violated("Writer rejects metadata the reader accepted");
  std::vector<uint8_t> out = std::move(header).value();
  const size_t data_start = out.size();
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const TensorInfo& src = f.tensors()[i];
    const TensorInfo& dst = w.tensors()[i];
    out.resize(data_start + dst.offset + dst.nbytes, 0);
    std::memcpy(out.data() + data_start + dst.offset, f.tensor_data(src), src.nbytes);
  }
  auto again = File::parse(out.data(), out.size(), "rewritten.gguf");
  if (!again.is_ok()) {
    std::fprintf(stderr, "%s\n", again.status().message().c_str());
    violated("rewritten file does not parse");
  }
  if (again->metadata().size() != f.metadata().size()) violated("metadata count changed");
  for (size_t i = 0; i < f.metadata().size(); ++i) {
    if (again->metadata()[i].key != f.metadata()[i].key || !(again->metadata()[i].value == f.metadata()[i].value)) {
      violated("metadata changed in round trip");
    }
  }
  if (again->tensors().size() != f.tensors().size()) violated("tensor count changed");
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const TensorInfo& a = again->tensors()[i];
    const TensorInfo& b = f.tensors()[i];
    if (a.name != b.name || a.type != b.type || a.shape != b.shape || a.nbytes != b.nbytes) violated("tensor changed");
    if (std::memcmp(again->tensor_data(a), f.tensor_data(b), a.nbytes) != 0) violated("tensor bytes changed");
  }
}

// A shard set: see the top of the file for the input layout.
void fuzz_shards(const uint8_t* data, size_t size) {
  size_t pos = 4;
  if (size < pos + 1) return;
  const size_t n = size_t(data[pos++] % 4) + 1;
  struct Piece {
    const uint8_t* p;
    uint64_t n;
  };
  std::vector<Piece> pieces;
  for (size_t k = 0; k + 1 < n; ++k) {
    if (size - pos < 4) return;
    uint32_t len = 0;
    std::memcpy(&len, data + pos, 4);
    pos += 4;
    pieces.push_back({nullptr, len});
  }
  for (Piece& piece : pieces) {
    if (piece.n > size - pos) return;
    piece.p = data + pos;
    pos += piece.n;
  }
  pieces.push_back({data + pos, size - pos});
  std::vector<sluice::gguf::ShardBytes> shards;
  for (size_t k = 0; k < pieces.size(); ++k) {
    shards.push_back({pieces[k].p, pieces[k].n, "shard" + std::to_string(k) + ".gguf"});
  }
  auto r = File::parse_shards(shards);
  if (!r.is_ok()) {
    const std::string& m = r.status().message();
    if (m.rfind("shard", 0) != 0 || m.find(".gguf: ") == std::string::npos) {
      violated("shard set error message does not start with a shard's name");
    }
    return;
  }
  const File& f = *r;
  if (f.shards().empty()) violated("no shards");
  if (f.shards().size() != 1 && f.shards().size() != pieces.size()) violated("shard count differs from the set");
  if (f.is_split()) {
    auto count = f.get_uint(sluice::gguf::kSplitCount);
    auto total = f.get_int(sluice::gguf::kSplitTensorsCount);
    if (!count.is_ok() || *count != pieces.size()) violated("split accepted with split.count != shards given");
    if (!total.is_ok() || uint64_t(*total) != f.tensors().size()) violated("split accepted with a wrong tensor total");
  }
  volatile uint64_t sink = 0;
  uint64_t counted = 0;
  for (const auto& sh : f.shards()) counted += sh.n_tensors;
  if (counted != f.tensors().size()) violated("shards' tensor counts do not add up");
  for (const TensorInfo& t : f.tensors()) {
    if (f.find_tensor(t.name) != &t) violated("find_tensor() does not return the tensor (duplicate across shards?)");
    if (t.shard >= f.shards().size()) violated("tensor in a shard that does not exist");
    const auto& sh = f.shards()[t.shard];
    const Piece& piece = pieces[t.shard];
    if (t.offset % sh.alignment != 0) violated("misaligned offset accepted in a shard");
    if (f.file_offset(t) + t.nbytes > piece.n) violated("tensor past the end of its shard accepted");
    const uint8_t* p = f.tensor_data(t);
    if (p != piece.p + f.file_offset(t)) violated("tensor_data() points outside its shard");
    sink = sink + p[0] + p[t.nbytes - 1];
  }
  for (const auto& kv : f.metadata()) sink = sink + walk(kv.value, 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size >= 4 && std::memcmp(data, "GSPL", 4) == 0) {
    fuzz_shards(data, size);
    return 0;
  }
  auto r = File::parse(data, size, "fuzz.gguf");
  if (!r.is_ok()) {
    const std::string& m = r.status().message();
    if (m.rfind("fuzz.gguf: ", 0) != 0) violated("error message does not start with the file name");
    return 0;
  }
  check(*r, data, size);
  round_trip(*r);
  return 0;
}
