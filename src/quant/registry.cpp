// Type traits, run-time ISA detection and the per-ISA kernel tables. Every table is built once,
// on first use, into a function-local immutable static.
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <array>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string>

#include "quant/blocks.h"
#include "quant/quant.h"
#include "quant/ref.h"
#include "quant/simd.h"

namespace sluice::quant {
namespace {

constexpr TypeTraits kTraits[] = {
    {Type::kF32, "f32", 1, 4},
    {Type::kF16, "f16", 1, 2},
    {Type::kQ4_0, "q4_0", kQK, sizeof(BlockQ4_0)},
    {Type::kQ4_1, "q4_1", kQK, sizeof(BlockQ4_1)},
    {Type::kQ5_0, "q5_0", kQK, sizeof(BlockQ5_0)},
    {Type::kQ5_1, "q5_1", kQK, sizeof(BlockQ5_1)},
    {Type::kQ8_0, "q8_0", kQK, sizeof(BlockQ8_0)},
    {Type::kQ8_1, "q8_1", kQK, sizeof(BlockQ8_1)},
    {Type::kQ2_K, "q2_k", kQK_K, sizeof(BlockQ2_K)},
    {Type::kQ3_K, "q3_k", kQK_K, sizeof(BlockQ3_K)},
    {Type::kQ4_K, "q4_k", kQK_K, sizeof(BlockQ4_K)},
    {Type::kQ5_K, "q5_k", kQK_K, sizeof(BlockQ5_K)},
    {Type::kQ6_K, "q6_k", kQK_K, sizeof(BlockQ6_K)},
    {Type::kQ8_K, "q8_k", kQK_K, sizeof(BlockQ8_K)},
    {Type::kBF16, "bf16", 1, 2},
};

const TypeTraits* find_traits(uint32_t id) {
  for (const auto& t : kTraits)
    if (uint32_t(t.type) == id) return &t;
  return nullptr;
}

using Table = std::array<Kernels, detail::kMaxTypeId>;

Table make_ref_table() {
  Table t{};
  auto set = [&t](Type ty, auto deq, auto q, Type dot_type, auto dot) {
    Kernels& k = t[size_t(ty)];
    k.dequantize_row = deq;
    k.quantize_row = q;
    k.vec_dot_type = dot_type;
    k.vec_dot = dot;
  };
  using VecDot = void (*)(int64_t, const void*, const void*, float*);
  set(Type::kF32, ref::dequantize_row_f32, ref::quantize_row_f32, Type::kF32, ref::vec_dot_f32);
  set(Type::kF16, ref::dequantize_row_f16, ref::quantize_row_f16, Type::kF16, ref::vec_dot_f16);
  set(Type::kBF16, ref::dequantize_row_bf16, ref::quantize_row_bf16, Type::kBF16, ref::vec_dot_bf16);
  set(Type::kQ4_0, ref::dequantize_row_q4_0, ref::quantize_row_q4_0, Type::kQ8_0, ref::vec_dot_q4_0);
  set(Type::kQ4_1, ref::dequantize_row_q4_1, ref::quantize_row_q4_1, Type::kQ8_1, ref::vec_dot_q4_1);
  set(Type::kQ5_0, ref::dequantize_row_q5_0, ref::quantize_row_q5_0, Type::kQ8_0, ref::vec_dot_q5_0);
  set(Type::kQ5_1, ref::dequantize_row_q5_1, ref::quantize_row_q5_1, Type::kQ8_1, ref::vec_dot_q5_1);
  set(Type::kQ8_0, ref::dequantize_row_q8_0, ref::quantize_row_q8_0, Type::kQ8_0, ref::vec_dot_q8_0);
  set(Type::kQ8_1, ref::dequantize_row_q8_1, ref::quantize_row_q8_1, Type::kQ8_1, VecDot{nullptr});
  set(Type::kQ2_K, ref::dequantize_row_q2_k, ref::quantize_row_q2_k, Type::kQ8_K, ref::vec_dot_q2_k);
  set(Type::kQ3_K, ref::dequantize_row_q3_k, ref::quantize_row_q3_k, Type::kQ8_K, ref::vec_dot_q3_k);
  set(Type::kQ4_K, ref::dequantize_row_q4_k, ref::quantize_row_q4_k, Type::kQ8_K, ref::vec_dot_q4_k);
  set(Type::kQ5_K, ref::dequantize_row_q5_k, ref::quantize_row_q5_k, Type::kQ8_K, ref::vec_dot_q5_k);
  set(Type::kQ6_K, ref::dequantize_row_q6_k, ref::quantize_row_q6_k, Type::kQ8_K, ref::vec_dot_q6_k);
  set(Type::kQ8_K, ref::dequantize_row_q8_k, ref::quantize_row_q8_k, Type::kQ8_K, VecDot{nullptr});
  // vec_dot_cols specification: a loop over the reference vec_dot, for every weight format.
  auto cols = [&t](Type ty, auto fn) { t[size_t(ty)].vec_dot_cols = fn; };
  cols(Type::kF32, ref::vec_dot_cols<ref::vec_dot_f32>);
  cols(Type::kF16, ref::vec_dot_cols<ref::vec_dot_f16>);
  cols(Type::kBF16, ref::vec_dot_cols<ref::vec_dot_bf16>);
  cols(Type::kQ4_0, ref::vec_dot_cols<ref::vec_dot_q4_0>);
  cols(Type::kQ4_1, ref::vec_dot_cols<ref::vec_dot_q4_1>);
  cols(Type::kQ5_0, ref::vec_dot_cols<ref::vec_dot_q5_0>);
  cols(Type::kQ5_1, ref::vec_dot_cols<ref::vec_dot_q5_1>);
  cols(Type::kQ8_0, ref::vec_dot_cols<ref::vec_dot_q8_0>);
  cols(Type::kQ2_K, ref::vec_dot_cols<ref::vec_dot_q2_k>);
  cols(Type::kQ3_K, ref::vec_dot_cols<ref::vec_dot_q3_k>);
  cols(Type::kQ4_K, ref::vec_dot_cols<ref::vec_dot_q4_k>);
  cols(Type::kQ5_K, ref::vec_dot_cols<ref::vec_dot_q5_k>);
  cols(Type::kQ6_K, ref::vec_dot_cols<ref::vec_dot_q6_k>);
  // vec_dot_tile specification: the same loops over rows and columns.
  auto tile = [&t](Type ty, auto fn) { t[size_t(ty)].vec_dot_tile = fn; };
  tile(Type::kF32, ref::vec_dot_tile<ref::vec_dot_f32>);
  tile(Type::kF16, ref::vec_dot_tile<ref::vec_dot_f16>);
  tile(Type::kBF16, ref::vec_dot_tile<ref::vec_dot_bf16>);
  tile(Type::kQ4_0, ref::vec_dot_tile<ref::vec_dot_q4_0>);
  tile(Type::kQ4_1, ref::vec_dot_tile<ref::vec_dot_q4_1>);
  tile(Type::kQ5_0, ref::vec_dot_tile<ref::vec_dot_q5_0>);
  tile(Type::kQ5_1, ref::vec_dot_tile<ref::vec_dot_q5_1>);
  tile(Type::kQ8_0, ref::vec_dot_tile<ref::vec_dot_q8_0>);
  tile(Type::kQ2_K, ref::vec_dot_tile<ref::vec_dot_q2_k>);
  tile(Type::kQ3_K, ref::vec_dot_tile<ref::vec_dot_q3_k>);
  tile(Type::kQ4_K, ref::vec_dot_tile<ref::vec_dot_q4_k>);
  tile(Type::kQ5_K, ref::vec_dot_tile<ref::vec_dot_q5_k>);
  tile(Type::kQ6_K, ref::vec_dot_tile<ref::vec_dot_q6_k>);
  detail::install_packed_ref(t.data());
  return t;
}

#if defined(SLUICE_QUANT_X86)
// F16C from CPUID leaf 1 (ECX bit 29): clang does not accept "f16c" in __builtin_cpu_supports.
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
}
#endif

#if defined(SLUICE_QUANT_X86)
// AMX-TILE and AMX-INT8 (CPUID leaf 7: EDX bits 24 and 25), the OS saving the tile state (XCR0
// bits 17 and 18), and, on Linux, this process's permission to use it: the kernel hands out the
// 8 KB tile data state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA);
// without it the first tile instruction faults. Asked once, when the kernel tables are built.
bool cpu_has_amx_int8() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  if ((edx & (1u << 24)) == 0 || (edx & (1u << 25)) == 0) return false;
  unsigned c1 = 0, d1 = 0, a1 = 0, b1 = 0;
  if (!__get_cpuid(1, &a1, &b1, &c1, &d1) || (c1 & (1u << 27)) == 0) return false;  // OSXSAVE
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return false;
#endif
  return true;
}
#endif

bool cpu_has(Isa isa) {
#if defined(SLUICE_QUANT_X86)
  switch (isa) {
    case Isa::kRef:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case Isa::kAvx512:
      // Every feature cpu_avx512.cpp is compiled for (src/quant/CMakeLists.txt), each checked
      // on its own: parts exist with avx512f but without VNNI or BF16 (Skylake-X, Zen 3 has
      // none). __builtin_cpu_supports also requires the OS to save the zmm/opmask state.
      return cpu_has(Isa::kAvx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bf16");
    case Isa::kAmx:
      return cpu_has(Isa::kAvx512) && cpu_has_amx_int8();
  }
  return false;
#else
  return isa == Isa::kRef;
#endif
}

// Records which entries an install replaced, so each entry names the ISA of its code.
void mark_isa(const Table& before, Table& after, Isa isa) {
  for (size_t i = 0; i < after.size(); ++i) {
    if (after[i].vec_dot != before[i].vec_dot) after[i].vec_dot_isa = isa;
    if (after[i].vec_dot_cols != before[i].vec_dot_cols) after[i].vec_dot_cols_isa = isa;
    if (after[i].vec_dot_tile != before[i].vec_dot_tile) after[i].vec_dot_tile_isa = isa;
    if (after[i].vec_dot_packed != before[i].vec_dot_packed) after[i].vec_dot_packed_isa = isa;
  }
}

// Tables for each ISA the CPU has; a higher ISA starts from the lower one's kernels.
struct Tables {
  Table ref, avx2, avx512, amx;
  bool has_avx2 = false, has_avx512 = false, has_amx = false;
};

const Tables& tables() {
  static const Tables kTables = [] {
    Tables t;
    t.ref = make_ref_table();
    t.has_avx2 = cpu_has(Isa::kAvx2);
    t.has_avx512 = t.has_avx2 && cpu_has(Isa::kAvx512);
    t.avx2 = t.ref;
    // The reference vec_dot_cols loops over the scalar vec_dot: slower than the AVX2 vec_dot a
    // caller would fall back to, so a SIMD table carries only specialised multi-column kernels.
    for (Kernels& k : t.avx2) {
      k.vec_dot_cols = nullptr;
      k.vec_dot_tile = nullptr;
      k.vec_dot_packed = nullptr;  // the packing functions stay: they are portable
    }
    if (t.has_avx2) {
      const Table before = t.avx2;
      detail::install_avx2(t.avx2.data());
      detail::install_avx2_cols(t.avx2.data());
      mark_isa(before, t.avx2, Isa::kAvx2);
    }
    t.avx512 = t.avx2;
    if (t.has_avx512) {
      const Table before = t.avx512;
      detail::install_avx512(t.avx512.data());
      detail::install_avx512_tile(t.avx512.data());
      detail::install_avx512_packed(t.avx512.data());
      mark_isa(before, t.avx512, Isa::kAvx512);
    }
    t.amx = t.avx512;
    if (t.has_avx512 && cpu_has(Isa::kAmx)) {
      const Table before = t.amx;
      t.has_amx = detail::install_amx_packed(t.amx.data());
      mark_isa(before, t.amx, Isa::kAmx);
    }
    return t;
  }();
  return kTables;
}

}  // namespace

const TypeTraits* type_traits(uint32_t raw_type_id) { return find_traits(raw_type_id); }

const TypeTraits& traits(Type t) {
  const TypeTraits* tt = find_traits(uint32_t(t));
  SLUICE_CHECK(tt != nullptr, "traits() of an unknown Type value " + std::to_string(uint32_t(t)));
  return *tt;
}

std::optional<Type> type_from_name(std::string_view name) {
  for (const auto& t : kTraits) {
    const std::string_view tn = t.name;
    if (tn.size() != name.size()) continue;
    bool eq = true;
    for (size_t i = 0; i < tn.size() && eq; ++i)
      eq = std::tolower(static_cast<unsigned char>(name[i])) == static_cast<unsigned char>(tn[i]);
    if (eq) return t.type;
  }
  return std::nullopt;
}

int64_t row_bytes(Type t, int64_t n) {
  const TypeTraits& tt = traits(t);
  if (n < 0 || n % tt.block_elems != 0) return -1;
  return n / tt.block_elems * tt.block_bytes;
}

Status validate_row(Type t, int64_t n) {
  const TypeTraits* tt = find_traits(uint32_t(t));
  if (tt == nullptr) return invalid_argument("unknown tensor type id " + std::to_string(uint32_t(t)));
  if (n < 0 || n % tt->block_elems != 0) {
    return invalid_argument(std::string("row of ") + std::to_string(n) + " elements is not a multiple of the " +
                            tt->name + " block size " + std::to_string(tt->block_elems));
  }
  return Status::ok();
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kRef:
      return "ref";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAmx:
      return "amx";
  }
  return "?";
}

// The best ISA the CPU has, capped by env SLUICE_QUANT_ISA=ref|avx2|avx512 (read once; for
// parity debugging and benchmarks).
Isa best_isa() {
  static const Isa kBest = [] {
    const Tables& t = tables();
    Isa best = t.has_amx ? Isa::kAmx : t.has_avx512 ? Isa::kAvx512 : t.has_avx2 ? Isa::kAvx2 : Isa::kRef;
    if (const char* cap = std::getenv("SLUICE_QUANT_ISA")) {
      if (std::strcmp(cap, "ref") == 0) best = Isa::kRef;
      if (std::strcmp(cap, "avx2") == 0 && best > Isa::kAvx2) best = Isa::kAvx2;
      if (std::strcmp(cap, "avx512") == 0 && best > Isa::kAvx512) best = Isa::kAvx512;
    }
    return best;
  }();
  return kBest;
}

const Kernels* kernels_for(Type t, Isa isa) {
  const Tables& tb = tables();
  const size_t id = size_t(t);
  SLUICE_CHECK(id < detail::kMaxTypeId && find_traits(uint32_t(t)) != nullptr, "kernels_for() of an unknown Type");
  switch (isa) {
    case Isa::kRef:
      return &tb.ref[id];
    case Isa::kAvx2:
      return tb.has_avx2 ? &tb.avx2[id] : nullptr;
    case Isa::kAvx512:
      return tb.has_avx512 ? &tb.avx512[id] : nullptr;
    case Isa::kAmx:
      return tb.has_amx ? &tb.amx[id] : nullptr;
  }
  return nullptr;
}

const Kernels& kernels(Type t) { return *kernels_for(t, best_isa()); }

}  // namespace sluice::quant
