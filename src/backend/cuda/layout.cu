// group_weight_blocks (layout.h): GGUF Q6_K / Q8_0 bytes -> the grouped layout, in place. One
// thread block per group at a time: the group is read into shared memory as 16-byte words, then
// written back field by field in 2-byte units. Groups are independent, so in place is safe. A
// one-off pass at upload, at device copy speed.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/layout.h"

namespace sluice::backend::cuda {
namespace {

constexpr int kThreads = 128;
static_assert(kQ6kGroupBytes % 16 == 0 && kQ8GroupBytes % 16 == 0);

// Source byte (in the GGUF group) of output byte o (even) of the grouped layout.
template <bool kQ6>
__device__ __forceinline__ int source_of(int o) {
  if constexpr (kQ6) {
    if (o < kQ6kGroupQh) return (o / 128) * kQ6kBlockBytes + o % 128;
    if (o < kQ6kGroupScales) return ((o - kQ6kGroupQh) / 64) * kQ6kBlockBytes + 128 + (o - kQ6kGroupQh) % 64;
    if (o < kQ6kGroupD) return ((o - kQ6kGroupScales) / 16) * kQ6kBlockBytes + 192 + (o - kQ6kGroupScales) % 16;
    return ((o - kQ6kGroupD) / 2) * kQ6kBlockBytes + 208;
  } else {
    if (o < kQ8GroupD) return (o / 32) * 34 + 2 + o % 32;
    return ((o - kQ8GroupD) / 2) * 34;
  }
}

template <bool kQ6>
__global__ void __launch_bounds__(kThreads) group_kernel(uint8_t* w, int64_t ngroups) {
  constexpr int kBytes = kQ6 ? kQ6kGroupBytes : kQ8GroupBytes;
  __shared__ __align__(16) uint8_t in[kBytes];
  for (int64_t g = blockIdx.x; g < ngroups; g += gridDim.x) {
    uint8_t* p = w + g * kBytes;
    for (int i = threadIdx.x; i < kBytes / 16; i += kThreads) {
      reinterpret_cast<uint4*>(in)[i] = reinterpret_cast<const uint4*>(p)[i];
    }
    __syncthreads();
    for (int u = threadIdx.x; u < kBytes / 2; u += kThreads) {
      reinterpret_cast<uint16_t*>(p)[u] = *reinterpret_cast<const uint16_t*>(in + source_of<kQ6>(2 * u));
    }
    __syncthreads();
  }
}

}  // namespace

bool groups_enabled() {
  static const bool enabled = [] {  // immutable after its first initialization
    const char* env = std::getenv("SLUICE_CUDA_GROUPED");
    return !(env != nullptr && std::string(env) == "0");
  }();
  return enabled;
}

Status group_weight_blocks(quant::Type type, void* w, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (!groupable(type, cols) || rows < 0) {
    return invalid_argument("group_weight_blocks: no grouped layout for " + std::to_string(rows) + " x " +
                            std::to_string(cols) + " of this format (Q6_K rows of a multiple of 2048, Q8_0 of 256)");
  }
  if (w == nullptr || reinterpret_cast<uintptr_t>(w) % 16 != 0) {
    return invalid_argument("group_weight_blocks: weights must be 16-byte aligned");
  }
  const bool q6 = type == quant::Type::kQ6_K;
  const int64_t ngroups = rows * (cols / group_elems(type));
  if (ngroups == 0) return Status::ok();
  const int grid = int(std::min<int64_t>(ngroups, 8192));
  if (q6) {
    group_kernel<true><<<grid, kThreads, 0, stream>>>(static_cast<uint8_t*>(w), ngroups);
  } else {
    group_kernel<false><<<grid, kThreads, 0, stream>>>(static_cast<uint8_t*>(w), ngroups);
  }
  SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("group_kernel");
  return Status::ok();
}

}  // namespace sluice::backend::cuda
