// The CUDA entry points of backend.h in builds without CUDA: no devices, and a clear error for
// anyone who asks for one.
#include "backend/backend.h"

namespace sluice::backend {

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaOptions&) {
  return unsupported("this sluice was built without CUDA (configure with -DSLUICE_CUDA=ON on a machine with nvcc)");
}

int cuda_device_count() { return 0; }

uint64_t cuda_scratch_bytes(const ScratchShape&) { return uint64_t(512) << 20; }

Result<double> cuda_copy_bandwidth(int) { return unsupported("this sluice was built without CUDA"); }
Result<double> cuda_h2d_bandwidth(int) { return unsupported("this sluice was built without CUDA"); }
Result<double> cuda_h2d_bandwidth_during(int, uint64_t, const std::function<void()>&) {
  return unsupported("this sluice was built without CUDA");
}

}  // namespace sluice::backend
