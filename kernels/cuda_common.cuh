// Device helpers shared by the CUDA kernels: element conversions for the kernels, which are
// templates over their element types (bfloat16 or float32 activations and KV), loads through
// the runtime DType for small operands (norm weights), the host-side dispatch from a DType to
// a template instance, and warp/block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/core/dtype_enum.h"

namespace pdserve::cuda {

constexpr unsigned kFullWarpMask = 0xffffffffu;

__device__ __forceinline__ float to_float(__nv_bfloat16 value) {
  return __bfloat162float(value);
}
__device__ __forceinline__ float to_float(float value) {
  return value;
}
__device__ __forceinline__ float to_float(__nv_fp8_e4m3 value) {
  return static_cast<float>(value);
}

template <typename T>
__device__ __forceinline__ T from_float(float value);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float value) {
  return __float2bfloat16(value);
}
template <>
__device__ __forceinline__ float from_float<float>(float value) {
  return value;
}
// Round to nearest even, saturated to +-448 (NaN stays NaN): float_to_fp8_e4m3_saturated.
template <>
__device__ __forceinline__ __nv_fp8_e4m3 from_float<__nv_fp8_e4m3>(float value) {
  __nv_fp8_e4m3 result;
  result.__x = __nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3);
  return result;
}

// The value `value` has once stored as a T (so later reads of the stored element agree).
template <typename T>
__device__ __forceinline__ float round_to(float value) {
  return to_float(from_float<T>(value));
}

// Calls launch(T{}) with T the element type of `dtype` (bfloat16 or float32), so that each
// kernel is compiled once per element type instead of switching on the dtype per element;
// cudaErrorInvalidValue for another dtype (the backend refuses those before launching).
template <typename Launch>
cudaError_t with_element_type(DType dtype, Launch&& launch) {
  switch (dtype) {
    case DType::kBF16:
      return launch(__nv_bfloat16{});
    case DType::kF32:
      return launch(float{});
    default:
      return cudaErrorInvalidValue;
  }
}

// with_element_type for a KV pool's element type: also FP8 E4M3 (__nv_fp8_e4m3).
template <typename Launch>
cudaError_t with_kv_element_type(DType dtype, Launch&& launch) {
  if (dtype == DType::kF8E4M3) return launch(__nv_fp8_e4m3{});
  return with_element_type(dtype, launch);
}

// For small operands of any dtype (norm weights): one switch per element is cheap there.
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
