// GEMV instantiations for Q6_K, in GGUF order and in the grouped layout (layout.h; see gemv_kquant.cu).
#include "backend/cuda/gemv_launch.cuh"

namespace sluice::backend::cuda {
using namespace gemv_detail;

Status gemv_k6_format(const DeviceInfo& dev, const GemvGroupArgs& g, cudaStream_t stream) {
  if (g.type != quant::Type::kQ6_K) return unsupported("gemv_k6_format: not Q6_K");
  return g.grouped ? launch_gemv<FmtQ6_KG>(dev, g, stream) : launch_gemv<FmtQ6_K>(dev, g, stream);
}

}  // namespace sluice::backend::cuda
