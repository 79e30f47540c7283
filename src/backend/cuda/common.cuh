// Shared CUDA plumbing of the CUDA backend: error checks, launch checks, warp reductions and the
// small load helpers the kernels use. Included by .cu files only (model/ never sees it).
//
// Two kinds of CUDA failure, two macros:
//   SLUICE_CUDA_RETURN_IF_ERROR(call)  failures that can happen to a correct program (out of
//                                      memory, a lost device, a bad launch configuration that
//                                      came from data) become a Status naming file:line and the
//                                      CUDA error; the caller decides.
//   SLUICE_CUDA_CHECK(call)            programming errors (and tests/benchmarks, where there is no
//                                      caller to hand a Status to): abort with file:line.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <utility>

#include <cstdint>
#include <string>

#include "core/status.h"

namespace sluice::backend::cuda {

inline Status cuda_status(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return Status::ok();
  const ErrorCode code = err == cudaErrorMemoryAllocation ? ErrorCode::kOutOfMemory : ErrorCode::kInternal;
  return Status(code, std::string("CUDA error at ") + file + ":" + std::to_string(line) + ": " + what + ": " +
                          cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

}  // namespace sluice::backend::cuda

#define SLUICE_CUDA_RETURN_IF_ERROR(call)                                                         \
  do {                                                                                            \
    const cudaError_t _cu_err = (call);                                                           \
    if (_cu_err != cudaSuccess) return ::sluice::backend::cuda::cuda_status(_cu_err, #call, __FILE__, __LINE__); \
  } while (0)

#define SLUICE_CUDA_CHECK(call)                                                                   \
  do {                                                                                            \
    const cudaError_t _cu_err = (call);                                                           \
    if (_cu_err != cudaSuccess)                                                                   \
      ::sluice::check_failed(__FILE__, __LINE__, #call,                                           \
                             std::string(cudaGetErrorName(_cu_err)) + ": " + cudaGetErrorString(_cu_err)); \
  } while (0)

// After every launch: a bad configuration (grid, shared memory) is reported here, at the launch,
// not at some later unrelated call. Asynchronous faults inside the kernel surface at the next
// synchronizing call, which is checked too.
#define SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED(what) SLUICE_CUDA_RETURN_IF_ERROR((static_cast<void>(what), cudaGetLastError()))

namespace sluice::backend::cuda {

inline constexpr int kWarpSize = 32;

// Programmatic dependent launch (compute capability 9.0+; pdl_enabled()). A kernel launched
// with it may start while the previous kernel of its stream still runs: before pdl_wait() it may
// only read memory no earlier kernel writes (weights), and pdl_wait() returns once that kernel
// has finished and its writes are visible. pdl_trigger() lets the kernels launched after this one
// with the attribute start now (they still wait for all of it in their pdl_wait()). Both are
// no-ops on older GPUs and in kernels launched without the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// True where kernels are launched as programmatic dependents: compute capability 9.0+ on the
// current device, unless SLUICE_CUDA_PDL=0 (A/B runs). Asked once per process (gemv.cu).
bool pdl_enabled();

// Launches kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent of the
// kernel before it where pdl_enabled(): its launch and ramp-up overlap that kernel's tail. The
// kernel must call pdl_wait() before touching any memory an earlier kernel writes (the decode
// path's small kernels call it first thing, then pdl_trigger()).
template <class... KArgs, class... Args>
cudaError_t launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- shared-memory loads of packed weight bytes ------------------------------------------------
// Blocks of several formats are only 2-byte aligned (Q4_0 18 B, Q8_0 34 B, Q3_K 110 B, Q6_K 210 B),
// so a 32-bit word at an even offset is assembled from two 16-bit loads (lds_u32_a2), or a whole
// 32-byte run from aligned words (lds_run32_a2).
__device__ __forceinline__ uint32_t lds_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
__device__ __forceinline__ uint32_t lds_u32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ uint32_t lds_u32_a2(const uint8_t* p) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return uint32_t(h[0]) | (uint32_t(h[1]) << 16);
}
__device__ __forceinline__ uint4 lds_u128(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }
// The 32 bytes at p (2-byte aligned) as 8 words: aligned 32-bit loads shifted into place, 9 loads
// where 8 lds_u32_a2 calls make 16. The ninth word is read only when p is misaligned (the run then
// ends inside it), so nothing past the run's last aligned word is touched.
__device__ __forceinline__ void lds_run32_a2(const uint8_t* p, uint32_t (&out)[8]) {
  const uint32_t mis = uint32_t(reinterpret_cast<uintptr_t>(p)) & 2u;  // 0 or 2
  const uint32_t* w = reinterpret_cast<const uint32_t*>(p - mis);
  uint32_t v[9];
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = w[i];
  v[8] = mis ? w[8] : 0u;
#pragma unroll
  for (int j = 0; j < 8; ++j) out[j] = __funnelshift_r(v[j], v[j + 1], 8 * mis);
}

__device__ __forceinline__ float half_bits_to_float(uint32_t h) { return __half2float(__ushort_as_half(uint16_t(h))); }
__device__ __forceinline__ float bf16_bits_to_float(uint32_t h) { return __uint_as_float(h << 16); }

// Per-byte (q - k) for packed unsigned bytes q in [0, 127] and k in [0, 127]: setting bit 7
// first keeps every byte's subtraction from borrowing out of its lane, and flipping bit 7 back
// leaves the two's-complement int8 difference that dp4a reads as signed.
__device__ __forceinline__ int sub_bytes(uint32_t q, uint32_t k4) {
  return int(((q | 0x80808080u) - k4) ^ 0x80808080u);
}

// The int8 activation of 32 consecutive values held one per lane of a warp (every lane takes
// part): d = max|v| / 127 rounded to f16 (the precision GGUF's Q8_0 and Q8_1 activation blocks
// carry, as on the CPU path and in llama.cpp's CUDA backend), q = rne(v * 127 / max|v|),
// ds = (d, d * sum q). q points at the block's first byte, ds at its entry. gemv.cu's quantize
// kernel and the fused decode ops (norm, SwiGLU, attention combine) write activations with it, so
// the GEMV that reads one needs no quantize launch.
__device__ __forceinline__ void q8_block(float v, int8_t* q, float2* ds) {
  const int lane = threadIdx.x % kWarpSize;
  const float amax = warp_max(fabsf(v));
  const float d = __half2float(__float2half_rn(__fdiv_rn(amax, 127.0f)));
  const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
  const int qi = __float2int_rn(__fmul_rn(v, id));
  q[lane] = int8_t(qi);
  const int sum = warp_sum_int(qi);
  if (lane == 0) *ds = make_float2(d, __fmul_rn(d, float(sum)));
}

}  // namespace sluice::backend::cuda
