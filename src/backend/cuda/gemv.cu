// Entry points of the GEMV family: device query, activation quantization, format dispatch.
#include <cstdlib>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv.h"
#include "backend/cuda/layout.h"
#include "backend/cuda/gemv_launch.cuh"

namespace sluice::backend::cuda {

const char* gemv_type_name(quant::Type type) {
  switch (type) {
    case quant::Type::kF32: return "f32";
    case quant::Type::kF16: return "f16";
    case quant::Type::kBF16: return "bf16";
    case quant::Type::kQ4_0: return "q4_0";
    case quant::Type::kQ4_1: return "q4_1";
    case quant::Type::kQ5_0: return "q5_0";
    case quant::Type::kQ5_1: return "q5_1";
    case quant::Type::kQ8_0: return "q8_0";
    case quant::Type::kQ8_1: return "q8_1";
    case quant::Type::kQ2_K: return "q2_k";
    case quant::Type::kQ3_K: return "q3_k";
    case quant::Type::kQ4_K: return "q4_k";
    case quant::Type::kQ5_K: return "q5_k";
    case quant::Type::kQ6_K: return "q6_k";
    case quant::Type::kQ8_K: return "q8_k";
  }
  return "unknown";
}

Result<DeviceInfo> query_device(int device) {
  cudaDeviceProp prop{};
  SLUICE_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  if (prop.major < 8) {
    return unsupported("CUDA device " + std::to_string(device) + " (" + prop.name + ") has compute capability " +
                       std::to_string(prop.major) + "." + std::to_string(prop.minor) + "; sluice needs 8.0 or newer");
  }
  DeviceInfo info;
  info.device = device;
  info.sm_count = prop.multiProcessorCount;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  info.global_mem_bytes = int64_t(prop.totalGlobalMem);
  info.l2_bytes = prop.l2CacheSize;
  return info;
}

bool pdl_enabled() {
  // Immutable after its first initialization (the device's capability and the environment).
  static const bool enabled = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    const char* env = std::getenv("SLUICE_CUDA_PDL");
    return major >= 9 && !(env != nullptr && std::string(env) == "0");
  }();
  return enabled;
}

namespace gemv_detail {
bool gemv_direct_enabled() {
  static const bool enabled = [] {  // immutable after its first initialization
    const char* env = std::getenv("SLUICE_CUDA_GEMV_DIRECT");
    return !(env != nullptr && std::string(env) == "0");
  }();
  return enabled;
}
bool gemv_coalesced_enabled() {
  static const bool enabled = [] {  // immutable after its first initialization
    const char* env = std::getenv("SLUICE_CUDA_GEMV_COALESCED");
    return !(env != nullptr && std::string(env) == "0");
  }();
  return enabled;
}
}  // namespace gemv_detail

int64_t q8_activation_bytes(int64_t cols, int tokens) {
  const int64_t q_bytes = (cols * tokens + 15) / 16 * 16;
  return q_bytes + (cols / 32) * tokens * int64_t(sizeof(float2));
}

Q8Activation q8_activation_view(void* buffer, int64_t cols, int tokens) {
  Q8Activation v;
  v.q = static_cast<int8_t*>(buffer);
  v.ds = reinterpret_cast<float2*>(static_cast<uint8_t*>(buffer) + (cols * tokens + 15) / 16 * 16);
  v.cols = cols;
  v.tokens = tokens;
  return v;
}

namespace {

// One warp per 32-element block: lane i owns element i (q8_block, common.cuh). The arithmetic
// matches the CPU path's round-to-nearest-even activation quantizer bit for bit (IEEE division
// and multiply, rint, f16 d).
__global__ void quantize_q8_kernel(const float* __restrict__ x, int8_t* __restrict__ q, float2* __restrict__ ds,
                                   int64_t nblocks) {
  pdl_wait();
  pdl_trigger();  // the GEMV that reads this activation may start streaming its weights
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarpSize);
  for (int64_t blk = int64_t(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize; blk < nblocks;
       blk += warps) {
    q8_block(x[blk * 32 + lane], q + blk * 32, ds + blk);
  }
}

}  // namespace

Status quantize_activation_q8(const float* x, const Q8Activation& out, cudaStream_t stream) {
  if (out.cols <= 0 || out.cols % 32 != 0 || out.tokens < 1) {
    return invalid_argument("quantize_activation_q8: cols " + std::to_string(out.cols) + " must be a positive multiple of 32");
  }
  if (x == nullptr || out.q == nullptr || out.ds == nullptr) return invalid_argument("quantize_activation_q8: null pointer");
  const int64_t nblocks = out.cols / 32 * out.tokens;
  constexpr int kBlock = 256;
  const int64_t want = (nblocks + kBlock / kWarpSize - 1) / (kBlock / kWarpSize);
  const int grid = int(std::min<int64_t>(want, 4096));
  SLUICE_CUDA_RETURN_IF_ERROR(launch_pdl(quantize_q8_kernel, dim3(unsigned(grid)), dim3(kBlock), 0, stream, x, out.q,
                                         out.ds, nblocks));
  SLUICE_CUDA_RETURN_IF_LAUNCH_FAILED("quantize_q8_kernel");
  return Status::ok();
}

bool gemv_needs_q8(quant::Type type) {
  switch (type) {
    case quant::Type::kQ4_0: case quant::Type::kQ4_1: case quant::Type::kQ5_0: case quant::Type::kQ5_1:
    case quant::Type::kQ8_0: case quant::Type::kQ2_K: case quant::Type::kQ3_K: case quant::Type::kQ4_K:
    case quant::Type::kQ5_K: case quant::Type::kQ6_K:
      return true;
    default:
      return false;
  }
}

bool gemv_supported(quant::Type type) {
  return gemv_needs_q8(type) || type == quant::Type::kF32 || type == quant::Type::kF16 || type == quant::Type::kBF16;
}

Status gemv(const DeviceInfo& dev, const GemvArgs& args, cudaStream_t stream) {
  GemvGroupArgs g;
  g.type = args.type;
  g.cols = args.cols;
  g.tokens = args.tokens;
  g.variant = args.variant;
  g.grouped = args.grouped;
  g.n = 1;
  g.m[0] = GemvMatrix{args.w, args.rows, args.x, args.xq, args.y};
  return gemv_group(dev, g, stream);
}

Status gemv_group(const DeviceInfo& dev, const GemvGroupArgs& args, cudaStream_t stream) {
  if (args.grouped && !groupable(args.type, args.cols)) {
    return invalid_argument(std::string("gemv: no grouped layout for ") + gemv_type_name(args.type) + " rows of " +
                            std::to_string(args.cols) + " columns");
  }
  switch (args.type) {
    case quant::Type::kF32: case quant::Type::kF16: case quant::Type::kBF16:
      return gemv_float_formats(dev, args, stream);
    case quant::Type::kQ4_0: case quant::Type::kQ4_1: case quant::Type::kQ5_0: case quant::Type::kQ5_1:
    case quant::Type::kQ8_0:
      return gemv_legacy_formats(dev, args, stream);
    case quant::Type::kQ2_K: case quant::Type::kQ3_K: case quant::Type::kQ4_K: case quant::Type::kQ5_K:
    case quant::Type::kQ6_K:
      return gemv_k_formats(dev, args, stream);
    default:
      return unsupported(std::string("gemv: no CUDA kernel for weight format ") + gemv_type_name(args.type));
  }
}

}  // namespace sluice::backend::cuda
