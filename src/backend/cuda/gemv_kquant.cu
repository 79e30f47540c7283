// GEMV instantiations for the K-quants (Q2_K .. Q6_K), split over three files so they compile in
// parallel: Q2_K and Q3_K here, Q4_K and Q5_K in gemv_kquant45.cu, Q6_K in gemv_kquant6.cu.
#include "backend/cuda/gemv_launch.cuh"

namespace sluice::backend::cuda {
using namespace gemv_detail;

Status gemv_k_formats(const DeviceInfo& dev, const GemvGroupArgs& g, cudaStream_t stream) {
  switch (g.type) {
    case quant::Type::kQ2_K: return launch_gemv<FmtQ2_K>(dev, g, stream);
    case quant::Type::kQ3_K: return launch_gemv<FmtQ3_K>(dev, g, stream);
    case quant::Type::kQ4_K: case quant::Type::kQ5_K: return gemv_k45_formats(dev, g, stream);
    case quant::Type::kQ6_K: return gemv_k6_format(dev, g, stream);
    default: return unsupported("gemv_k_formats: not a K-quant");
  }
}

}  // namespace sluice::backend::cuda
