// GEMV instantiations for the 32-element block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
#include "backend/cuda/gemv_launch.cuh"

namespace sluice::backend::cuda {
using namespace gemv_detail;

Status gemv_legacy_formats(const DeviceInfo& dev, const GemvGroupArgs& g, cudaStream_t stream) {
  switch (g.type) {
    case quant::Type::kQ4_0: return launch_gemv<FmtQ4_0>(dev, g, stream);
    case quant::Type::kQ4_1: return launch_gemv<FmtQ4_1>(dev, g, stream);
    case quant::Type::kQ5_0: return launch_gemv<FmtQ5_0>(dev, g, stream);
    case quant::Type::kQ5_1: return launch_gemv<FmtQ5_1>(dev, g, stream);
    case quant::Type::kQ8_0: return g.grouped ? launch_gemv<FmtQ8_0G>(dev, g, stream) : launch_gemv<FmtQ8_0>(dev, g, stream);
    default: return unsupported("gemv_legacy_formats: not a 32-element block format");
  }
}

}  // namespace sluice::backend::cuda
