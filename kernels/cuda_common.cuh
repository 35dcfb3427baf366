// Device helpers shared by the CUDA kernels: typed loads/stores through the runtime DType
// (one kernel per op instead of one per dtype combination, to keep compile time low) and
// warp/block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/core/dtype_enum.h"

namespace pdserve::cuda {

constexpr unsigned kFullWarpMask = 0xffffffffu;

__device__ __forceinline__ float load_float(const void* base, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
    case DType::kF16:
      return __half2float(static_cast<const __half*>(base)[index]);
    default:
      return static_cast<const float*>(base)[index];
  }
}

__device__ __forceinline__ void store_float(void* base, DType dtype, int64_t index, float value) {
  switch (dtype) {
    case DType::kBF16:
      static_cast<__nv_bfloat16*>(base)[index] = __float2bfloat16(value);
      break;
    case DType::kF16:
      static_cast<__half*>(base)[index] = __float2half(value);
      break;
    default:
      static_cast<float*>(base)[index] = value;
  }
}

// The value `value` has once stored in `dtype` (so later reads of the stored element agree).
__device__ __forceinline__ float round_to(DType dtype, float value) {
  if (dtype == DType::kBF16) return __bfloat162float(__float2bfloat16(value));
  if (dtype == DType::kF16) return __half2float(__float2half(value));
  return value;
}

__device__ __forceinline__ float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(kFullWarpMask, value, offset);
  }
  return value;
}

__device__ __forceinline__ float warp_max(float value) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_xor_sync(kFullWarpMask, value, offset));
  }
  return value;
}

// Sum over the block; every thread gets the result. `scratch` holds 32 floats.
__device__ __forceinline__ float block_sum(float value, float* scratch) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int num_warps = (blockDim.x + 31) / 32;
  value = warp_sum(value);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  value = lane < num_warps ? scratch[lane] : 0.0f;
  return warp_sum(value);
}

}  // namespace pdserve::cuda
