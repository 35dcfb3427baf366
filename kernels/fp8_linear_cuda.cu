// The FP8 linear layer's own kernels: activation quantization per token and 128-element group
// (one warp per group), the weight scales' re-layout for cuBLASLt, and the dequantize
// fallback's weight expansion.
#include <cuda_fp8.h>

#include <algorithm>

#include "kernels/cuda_common.cuh"
#include "kernels/fp8_cuda_kernels.h"

namespace pdserve::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kGroup = 128;  // kFp8ActivationGroup
constexpr float kFp8Max = 448.0f;
constexpr float kScaleFloor = 1e-10f;

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

int grid_for(int64_t count) {
  return static_cast<int>(std::min<int64_t>(ceil_div(count, kThreads), 65535 * 8));
}

__device__ __forceinline__ uint8_t to_e4m3(float value) {
  // Round to nearest even, finite values beyond 448 clamped: float_to_fp8_e4m3_saturated.
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float from_e4m3(uint8_t code) {
  __nv_fp8_e4m3 value;
  value.__x = code;
  return static_cast<float>(value);
}

// Warp w of the grid quantizes group (row, group) = (w % rows, w / rows); each lane holds 4
// elements. Max is exact in any order, and the divisions are IEEE-rounded (__fdiv_rn), so the
// result is the host reference's bit for bit.
template <typename T>
__global__ void quantize_groups_kernel(Matrix x, uint8_t* q, float* scales, int64_t groups) {
  const int64_t warp = blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (warp >= x.rows * groups) return;
  const int64_t row = warp % x.rows;
  const int64_t group = warp / x.rows;
  const int64_t begin = group * kGroup;
  const T* in = static_cast<const T*>(x.data) + row * x.row_stride;
  float values[kGroup / 32];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kGroup / 32; ++i) {
    const int64_t j = begin + lane + 32 * i;
    values[i] = j < x.cols ? to_float(in[j]) : 0.0f;
    amax = fmaxf(amax, fabsf(values[i]));
  }
  amax = warp_max(amax);
  const float scale = __fdiv_rn(fmaxf(amax, kScaleFloor), kFp8Max);
  if (lane == 0) scales[group * x.rows + row] = scale;
#pragma unroll
  for (int i = 0; i < kGroup / 32; ++i) {
    const int64_t j = begin + lane + 32 * i;
    if (j < x.cols) q[row * x.cols + j] = to_e4m3(__fdiv_rn(values[i], scale));
  }
}

__global__ void tile_scales_kernel(const float* scales, int64_t n, int64_t k, int64_t block_n,
                                   int64_t block_k, float* grid, int64_t grid_stride) {
  const int64_t tile_rows = ceil_div(n, kGroup);
  const int64_t tile_cols = ceil_div(k, kGroup);
  const int64_t scale_cols = ceil_div(k, block_k);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < tile_rows * grid_stride;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ti = i / grid_stride;
    const int64_t tj = i % grid_stride;
    grid[i] = tj < tile_cols ? scales[(ti * kGroup / block_n) * scale_cols + tj * kGroup / block_k]
                             : 0.0f;
  }
}

template <typename T>
__global__ void dequantize_kernel(const uint8_t* weight, int64_t w_stride, const float* scales,
                                  int64_t block_n, int64_t block_k, Matrix out) {
  const int64_t count = out.rows * out.cols;
  const int64_t scale_cols = ceil_div(out.cols, block_k);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / out.cols;
    const int64_t c = i % out.cols;
    const float scale = scales[(r / block_n) * scale_cols + c / block_k];
    static_cast<T*>(out.data)[r * out.row_stride + c] =
        from_float<T>(from_e4m3(weight[r * w_stride + c]) * scale);
  }
}

}  // namespace

cudaError_t quantize_fp8_token_groups(Matrix x, uint8_t* q, float* scales, cudaStream_t stream) {
  if (x.rows == 0 || x.cols == 0) return cudaSuccess;
  const int64_t groups = ceil_div(x.cols, kGroup);
  const auto blocks = static_cast<unsigned>(ceil_div(x.rows * groups, kWarpsPerBlock));
  return with_element_type(x.dtype, [&](auto element) {
    using T = decltype(element);
    quantize_groups_kernel<T><<<blocks, kThreads, 0, stream>>>(x, q, scales, groups);
    return cudaGetLastError();
  });
}

cudaError_t fp8_tile_scales(const float* scales, int64_t n, int64_t k, int64_t block_n,
                            int64_t block_k, float* grid, int64_t grid_stride,
                            cudaStream_t stream) {
  const int64_t count = ceil_div(n, kGroup) * grid_stride;
  if (count == 0) return cudaSuccess;
  tile_scales_kernel<<<grid_for(count), kThreads, 0, stream>>>(scales, n, k, block_n, block_k, grid,
                                                               grid_stride);
  return cudaGetLastError();
}

cudaError_t dequantize_fp8(const uint8_t* weight, int64_t w_stride, const float* scales,
                           int64_t block_n, int64_t block_k, Matrix out, cudaStream_t stream) {
  if (out.rows == 0 || out.cols == 0) return cudaSuccess;
  return with_element_type(out.dtype, [&](auto element) {
    using T = decltype(element);
    dequantize_kernel<T><<<grid_for(out.rows * out.cols), kThreads, 0, stream>>>(
        weight, w_stride, scales, block_n, block_k, out);
    return cudaGetLastError();
  });
}

}  // namespace pdserve::cuda
