// Internal seam between the registry and the per-ISA kernel files. Each cpu_<isa>.cpp is compiled
// with its own target flags and only ever called after best_isa() has confirmed the CPU (and OS)
// support that ISA. The tables are indexed by raw type id.
#pragma once

#include "quant/quant.h"

namespace sluice::quant::detail {

inline constexpr int kMaxTypeId = 31;  // one past the largest supported raw type id (BF16 = 30)

// Overwrites the entries that the ISA accelerates; entries left alone keep the lower ISA's kernel.
void install_avx2(Kernels* table);
void install_avx2_cols(Kernels* table);  // vec_dot_cols (cpu_avx2_cols.cpp)
void install_avx512(Kernels* table);
void install_avx512_tile(Kernels* table);  // vec_dot_tile (cpu_avx512_tile.cpp)
void install_avx512_packed(Kernels* table);  // vec_dot_packed (cpu_avx512_packed.cpp)
void install_packed_ref(Kernels* table);     // packing + the scalar vec_dot_packed (packed.cpp)
bool install_amx_packed(Kernels* table);     // vec_dot_packed on AMX tiles (cpu_amx_packed.cpp);
                                             // false where the build has no AMX code

// The AVX-512 vec_dot_packed of Q4_K, Q6_K or Q8_0 (nullptr for other types or where the file
// was not compiled for AVX-512): the AMX kernel hands its ragged token tails (fewer than 16
// tokens) to it, which gives the same bits (cpu_amx_packed.cpp).
using PackedFn = void (*)(int64_t n, const void* w, int n_groups, const void* a, int64_t a_stride, int n_cols,
                          float* out, int64_t out_stride);
PackedFn avx512_packed(Type t);

}  // namespace sluice::quant::detail
