// group_weight_blocks (layout.h): GGUF Q6_K bytes -> the grouped layout, in place. One thread
// block per group: the 1680 bytes are read into shared memory (105 16-byte words), then written
// back field by field. Groups are independent, so in place is safe. A one-off pass at upload,
// at device copy speed.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/layout.h"

namespace sluice::backend::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWords = kQ6kGroupBytes / 16;  // 105
static_assert(kQ6kGroupBytes % 16 == 0);

__global__ void __launch_bounds__(kThreads) group_q6k_kernel(uint8_t* w, int64_t ngroups) {
  __shared__ __align__(16) uint8_t in[kQ6kGroupBytes];
  for (int64_t g = blockIdx.x; g < ngroups; g += gridDim.x) {
    uint8_t* p = w + g * kQ6kGroupBytes;
    for (int i = threadIdx.x; i < kWords; i += kThreads) {
      reinterpret_cast<uint4*>(in)[i] = reinterpret_cast<const uint4*>(p)[i];
    }
    __syncthreads();
    // Output 2-byte unit u (840 of them): the field it belongs to and its source.
    for (int u = threadIdx.x; u < kQ6kGroupBytes / 2; u += kThreads) {
      const int o = 2 * u;
      int src;
      if (o < kQ6kGroupQh) {
        src = (o / 128) * kQ6kBlockBytes + o % 128;
      } else if (o < kQ6kGroupScales) {
        const int r = o - kQ6kGroupQh;
        src = (r / 64) * kQ6kBlockBytes + 128 + r % 64;
      } else if (o < kQ6kGroupD) {
        const int r = o - kQ6kGroupScales;
        src = (r / 16) * kQ6kBlockBytes + 192 + r % 16;
      } else {
        src = ((o - kQ6kGroupD) / 2) * kQ6kBlockBytes + 208;
      }
      reinterpret_cast<uint16_t*>(p)[u] = *reinterpret_cast<const uint16_t*>(in + src);
    }
    __syncthreads();
  }
}

}  // namespace

bool q6k_groups_enabled() {
  static const bool enabled = [] {  // immutable after its first initialization
    const char* env = std::getenv("SLUICE_CUDA_Q6K_GROUPED");
    return !(env != nullptr && std::string(env) == "0");
  }();
  return enabled;
}

Status group_weight_blocks(quant::Type type, void* w, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (!groupable(type, cols) || rows < 0) {
    return invalid_argument("group_weight_blocks: no grouped layout for " + std::to_string(rows) + " x " +
                            std::to_string(cols) + " of this format (Q6_K rows of a multiple of 2048 only)");
  }
  if (w == nullptr || reinterpret_cast<uintptr_t>(w) % 16 != 0) {
    return invalid_argument("group_weight_blocks: weights must be 16-byte aligned");
  }
  const int64_t ngroups = rows * (cols / (256 * kQ6kGroupBlocks));
  if (ngroups == 0) return Status::ok();
  const int grid = int(std::min<int64_t>(ngroups, 8192));
  group_q6k_kernel<<<grid, kThreads, 0, stream>>>(static_cast<uint8_t*>(w), ngroups);
  SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("group_q6k_kernel");
  return Status::ok();
}

}  // namespace sluice::backend::cuda
