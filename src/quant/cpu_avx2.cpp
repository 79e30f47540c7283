// avx2 kernels (placeholder until the SIMD versions land).
#include "quant/simd.h"

namespace sluice::quant::detail {

void install_avx2(Kernels* table) { (void)table; }

}  // namespace sluice::quant::detail
