// GEMV instantiations for Q4_K and Q5_K (see gemv_kquant.cu).
#include "backend/cuda/gemv_launch.cuh"

namespace sluice::backend::cuda {
using namespace gemv_detail;

Status gemv_k45_formats(const DeviceInfo& dev, const GemvGroupArgs& g, cudaStream_t stream) {
  switch (g.type) {
    case quant::Type::kQ4_K: return launch_gemv<FmtQ4_K>(dev, g, stream);
    case quant::Type::kQ5_K: return launch_gemv<FmtQ5_K>(dev, g, stream);
    default: return unsupported("gemv_k45_formats: not Q4_K or Q5_K");
  }
}

}  // namespace sluice::backend::cuda
