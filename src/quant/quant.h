// Public interface of quant/: tensor element formats, their sizes, and the kernels that
// convert and multiply them. quant/ knows block layouts and math, nothing about files or devices.
//
// Numbering of Type equals the GGUF/ggml type id stored in files, so a raw id from a file maps
// directly (after a bounds check with type_traits()).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "core/status.h"

namespace sluice::quant {

enum class Type : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,   // activation format for Q4_1/Q5_1 dot products
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,  // activation format for K-quant dot products
  kBF16 = 30,
};

struct TypeTraits {
  Type type;
  const char* name;      // lower case, as accepted by --type: "q4_k", "f16", ...
  int64_t block_elems;   // elements per block (1 for F32/F16/BF16)
  int64_t block_bytes;   // bytes per block
};

// Traits of a raw type id read from a file; nullptr if the id is unknown or unsupported.
const TypeTraits* type_traits(uint32_t raw_type_id);
const TypeTraits& traits(Type t);
std::optional<Type> type_from_name(std::string_view name);  // case-insensitive
inline const char* type_name(Type t) { return traits(t).name; }

// Bytes of a row of n elements; n must be a multiple of block_elems (checked by caller with
// row_is_valid). Returns -1 if not.
int64_t row_bytes(Type t, int64_t n);

// Ok if a row of n elements of t is well formed (n >= 0 and a multiple of block_elems); else an
// invalid_argument Status naming the type, n and the block size. Kernels themselves treat a bad n
// as a programming error (SLUICE_CHECK abort), so validate lengths that come from files first.
Status validate_row(Type t, int64_t n);

// Instruction set a kernel table was built for. kRef is the scalar specification. kAmx is the
// AVX-512 table with an AMX-INT8 tile kernel for Q8_0's vec_dot_packed (batches of 16+ tokens);
// its other entries are the AVX-512 ones. The order is the order of capability (a table of a higher ISA
// starts from the lower one's kernels).
enum class Isa { kRef = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3 };
const char* isa_name(Isa isa);
Isa best_isa();  // detected once from cpuid (immutable afterwards)

// One format's kernels. Any pointer may be null where the operation does not exist for a format
// (e.g. no vec_dot for Q8_K, which is only an activation format).
struct Kernels {
  // dst[0..n) = dequantize(src); n multiple of block_elems.
  void (*dequantize_row)(const void* src, float* dst, int64_t n) = nullptr;
  // dst = quantize(src[0..n)); n multiple of block_elems.
  void (*quantize_row)(const float* src, void* dst, int64_t n) = nullptr;
  // The activation format vec_dot expects its second operand in, paired as llama.cpp's CPU
  // backend pairs them: F32 x F32; F16 x F16 and BF16 x BF16 (activations are rounded to the
  // weight's own 16-bit format, as ggml-cpu does); Q4_0/Q5_0/Q8_0 x Q8_0; Q4_1/Q5_1 x Q8_1;
  // Q2_K..Q6_K x Q8_K. Activation-only formats (Q8_1, Q8_K) have kernels with vec_dot = null.
  //
  // Activation quantizers: the kRef table's Q8_0/Q8_1/Q8_K quantize_row are bit-identical to
  // ggml's reference quantizers. The AVX2/AVX-512 tables' Q8_0/Q8_1 quantize_row reproduce
  // ggml-cpu's x86 build bit for bit instead (multiplier 127/amax, round half to even; see
  // ref::quantize_row_q8_0_rne), since that is what a llama.cpp CPU run on x86 computes. Q8_K is
  // the same in every table. F16/BF16 quantize_row round to nearest even.
  Type vec_dot_type = Type::kF32;
  // *out = sum_i w[i] * a[i] over n elements; w is a row in this format, a is in vec_dot_type.
  void (*vec_dot)(int64_t n, const void* w, const void* a, float* out) = nullptr;
  // Multi-column dot for prefill: one weight row against n_cols activation rows, each already in
  // vec_dot_type:
  //   out[c] = vec_dot(n, w, (const char*)a + c * a_stride, ...)   for c in [0, n_cols)
  // a_stride is in bytes (>= row_bytes(vec_dot_type, n)); n_cols >= 0; out has n_cols floats.
  // The kernel decodes each weight block once and dots it with several columns, so weight
  // decode and weight bandwidth are shared; results equal vec_dot's up to f32 summation order.
  // nullptr where no such kernel exists for this format and ISA: loop over vec_dot instead.
  // The kRef table has one for every weight format (a loop over its vec_dot: the specification).
  void (*vec_dot_cols)(int64_t n, const void* w, const void* a, int64_t a_stride, int n_cols,
                       float* out) = nullptr;
  // Register-blocked tile for prefill: n_rows weight rows against n_cols activation rows,
  //   out[c * out_stride + r] = vec_dot(n, (const char*)w + r * w_stride,
  //                                     (const char*)a + c * a_stride, ...)
  // for r in [0, n_rows), c in [0, n_cols). w_stride and a_stride are in bytes (>= the row
  // bytes of the weight and of vec_dot_type), out_stride in floats (>= n_rows), so a token-major
  // output matrix y[token][row] is written in place. The kernel keeps a block of rows x columns
  // of accumulators in registers: each activation block loaded serves several rows and each
  // decoded weight block several columns. Per-block integer sums are exact as in vec_dot;
  // results equal vec_dot's up to f32 summation order (the kernels may also apply the K-quant
  // min terms of several columns in one f32 vector). nullptr where there is no such kernel:
  // use vec_dot_cols or vec_dot. The kRef table has one for every weight format (loops over its
  // vec_dot: the specification).
  void (*vec_dot_tile)(int64_t n, const void* w, int64_t w_stride, int n_rows, const void* a, int64_t a_stride,
                       int n_cols, float* out, int64_t out_stride) = nullptr;
  // Row-interleaved ("packed") layout, for weights a backend keeps resident and multiplies
  // many times: packed_rows rows of a matrix are stored together, block by block, so that one
  // SIMD register holds the same few elements of every row (layout: BlockQ4_Kx16 in blocks.h).
  // The kernel then loads each weight vector once per token tile and each token's activations as
  // broadcasts shared by all rows, which halves the instructions per multiply-add of the
  // row-by-row kernels. packed_rows = 0: no packed layout for this format (and ISA).
  //   pack_rows: packs rows [0, packed_rows) of a plain matrix (rows at src_stride bytes, n
  //     elements each) into packed_bytes(n) bytes at dst.
  //   vec_dot_packed: n_groups consecutive packed groups (rows 0 .. n_groups * packed_rows)
  //     against n_cols activation rows in vec_dot_type at a_stride bytes:
  //       out[c * out_stride + r] = vec_dot(row r, activation column c)
  //     equal to vec_dot up to f32 summation order (integer sums per sub-block are exact).
  // The kRef table's entries are the specification (unpack, then the scalar vec_dot).
  int packed_rows = 0;
  int64_t (*packed_bytes)(int64_t n) = nullptr;
  void (*pack_rows)(const void* src, int64_t src_stride, void* dst, int64_t n) = nullptr;
  void (*vec_dot_packed)(int64_t n, const void* w, int n_groups, const void* a, int64_t a_stride, int n_cols,
                         float* out, int64_t out_stride) = nullptr;
  // Instruction set of the code behind vec_dot, vec_dot_cols and vec_dot_tile in this table
  // entry. A table of a higher ISA keeps the lower ISA's kernel where it has no specialised one
  // (e.g. the AVX-512 table's Q3_K vec_dot is AVX2 code); benchmarks and docs label rows with these.
  Isa vec_dot_isa = Isa::kRef;
  Isa vec_dot_cols_isa = Isa::kRef;
  Isa vec_dot_tile_isa = Isa::kRef;
  Isa vec_dot_packed_isa = Isa::kRef;
};

// Fastest kernels for this CPU.
const Kernels& kernels(Type t);
// Kernels of one instruction set (for tests and benchmarks). Falls back to the next lower
// ISA for formats without a specialised version; nullptr if the CPU lacks the ISA.
const Kernels* kernels_for(Type t, Isa isa);

}  // namespace sluice::quant
