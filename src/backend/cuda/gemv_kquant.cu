// GEMV instantiations for the K-quants (Q2_K .. Q6_K).
#include "backend/cuda/gemv_launch.cuh"

namespace sluice::backend::cuda {
using namespace gemv_detail;

Status gemv_k_formats(const DeviceInfo& dev, const GemvArgs& g, cudaStream_t stream) {
  switch (g.type) {
    case quant::Type::kQ2_K: return launch_gemv<FmtQ2_K>(dev, g, stream);
    case quant::Type::kQ3_K: return launch_gemv<FmtQ3_K>(dev, g, stream);
    case quant::Type::kQ4_K: return launch_gemv<FmtQ4_K>(dev, g, stream);
    case quant::Type::kQ5_K: return launch_gemv<FmtQ5_K>(dev, g, stream);
    case quant::Type::kQ6_K: return launch_gemv<FmtQ6_K>(dev, g, stream);
    default: return unsupported("gemv_k_formats: not a K-quant");
  }
}

}  // namespace sluice::backend::cuda
