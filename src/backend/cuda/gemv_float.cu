// GEMV instantiations for F32, F16 and BF16 weights (f32 activations, f32 accumulation).
#include "backend/cuda/gemv_launch.cuh"

namespace sluice::backend::cuda {
using namespace gemv_detail;

Status gemv_float_formats(const DeviceInfo& dev, const GemvGroupArgs& g, cudaStream_t stream) {
  switch (g.type) {
    case quant::Type::kF32: return launch_gemv<FmtF32>(dev, g, stream);
    case quant::Type::kF16: return launch_gemv<FmtF16>(dev, g, stream);
    case quant::Type::kBF16: return launch_gemv<FmtBF16>(dev, g, stream);
    default: return unsupported("gemv_float_formats: not a float format");
  }
}

}  // namespace sluice::backend::cuda
