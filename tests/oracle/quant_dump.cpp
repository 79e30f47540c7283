// quant_dump: a small command-line bridge that lets an independent implementation (the python
// gguf package, driven by quant_oracle.py) check sluice's formats byte for byte.
//
//   quant_dump dequant  <type> <n_elements> <in_file> <byte_offset> <out_f32_file>
//   quant_dump quantize <type> <n_elements> <in_f32_file> <out_file> [isa]
//
// <type> is a name as accepted by type_from_name ("q4_k", "bf16", ...). dequant reads
// row_bytes(type, n) bytes at byte_offset of in_file and writes n little-endian f32.
// quantize uses the table of the given isa (ref, avx2, avx512; default ref).
// Exit status: 0 ok, 2 bad arguments or input (with a message on stderr).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "quant/quant.h"

namespace {

using sluice::quant::Isa;
using sluice::quant::Type;

int fail(const std::string& msg) {
  std::fprintf(stderr, "quant_dump: %s\n", msg.c_str());
  return 2;
}

bool read_at(const char* path, long offset, void* dst, size_t bytes) {
  FILE* f = std::fopen(path, "rb");
  if (!f) return false;
  const bool ok = std::fseek(f, offset, SEEK_SET) == 0 && std::fread(dst, 1, bytes, f) == bytes;
  std::fclose(f);
  return ok;
}

bool write_all(const char* path, const void* src, size_t bytes) {
  FILE* f = std::fopen(path, "wb");
  if (!f) return false;
  const bool ok = std::fwrite(src, 1, bytes, f) == bytes;
  return std::fclose(f) == 0 && ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) return fail("usage: quant_dump dequant|quantize <type> <n> <in> ...");
  const std::string mode = argv[1];
  const auto type = sluice::quant::type_from_name(argv[2]);
  if (!type) return fail(std::string("unknown type ") + argv[2]);
  char* end = nullptr;
  const long long n = std::strtoll(argv[3], &end, 10);
  if (*end != 0) return fail(std::string("bad element count ") + argv[3]);
  if (auto st = sluice::quant::validate_row(*type, n); !st) return fail(st.message());
  const int64_t bytes = sluice::quant::row_bytes(*type, n);

  if (mode == "dequant") {
    if (argc != 7) return fail("dequant needs <type> <n> <in_file> <byte_offset> <out_file>");
    const long offset = std::strtol(argv[5], &end, 10);
    if (*end != 0 || offset < 0) return fail(std::string("bad byte offset ") + argv[5]);
    std::vector<unsigned char> raw(size_t(bytes) + 1);
    if (!read_at(argv[4], offset, raw.data(), size_t(bytes))) return fail(std::string("cannot read ") + argv[4]);
    std::vector<float> out(static_cast<size_t>(n));
    sluice::quant::kernels_for(*type, Isa::kRef)->dequantize_row(raw.data(), out.data(), n);
    if (!write_all(argv[6], out.data(), out.size() * sizeof(float))) return fail("cannot write output");
    return 0;
  }
  if (mode == "quantize") {
    if (argc != 6 && argc != 7) return fail("quantize needs <type> <n> <in_f32_file> <out_file> [isa]");
    Isa isa = Isa::kRef;
    if (argc == 7) {
      const std::string s = argv[6];
      if (s == "avx2") isa = Isa::kAvx2;
      else if (s == "avx512") isa = Isa::kAvx512;
      else if (s == "amx") isa = Isa::kAmx;
      else if (s != "ref") return fail("unknown isa " + s);
    }
    const auto* k = sluice::quant::kernels_for(*type, isa);
    if (!k) return fail(std::string("this CPU lacks ") + argv[6]);
    std::vector<float> in(static_cast<size_t>(n));
    if (!read_at(argv[4], 0, in.data(), in.size() * sizeof(float))) return fail(std::string("cannot read ") + argv[4]);
    std::vector<unsigned char> out(size_t(bytes) + 1);
    k->quantize_row(in.data(), out.data(), n);
    if (!write_all(argv[5], out.data(), size_t(bytes))) return fail("cannot write output");
    return 0;
  }
  return fail("unknown mode " + mode);
}
