// RMSNorm and the fused residual-add + RMSNorm on CUDA: one block per row, float sums, one
// instance per element type (bfloat16 or float32 activations).
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_kernels.h"

namespace pdserve::cuda {
namespace {

constexpr int kThreads = 256;

// Pass 1 forms each element (in, or in + add rounded to T, stored to sum_out) and the sum of
// squares; pass 2 rereads what pass 1 left and writes the normalized row. A thread touches
// the same columns in both passes, so in/out and add/sum_out may alias.
template <typename T>
__global__ void rms_norm_kernel(Matrix in, Matrix add, Matrix sum_out, Vector weight, float eps,
                                Matrix out) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const bool fused_add = add.data != nullptr;
  const T* in_row = static_cast<const T*>(in.data) + row * in.row_stride;
  const T* add_row = fused_add ? static_cast<const T*>(add.data) + row * add.row_stride : nullptr;
  T* sum_row = fused_add ? static_cast<T*>(sum_out.data) + row * sum_out.row_stride : nullptr;
  float sum_squares = 0.0f;
  for (int64_t j = threadIdx.x; j < in.cols; j += blockDim.x) {
    float value = to_float(in_row[j]);
    if (fused_add) {
      value = round_to<T>(value + to_float(add_row[j]));
      sum_row[j] = from_float<T>(value);
    }
    sum_squares += value * value;
  }
  const float total = block_sum(sum_squares, scratch);
  const float inv_rms = rsqrtf(total / static_cast<float>(in.cols) + eps);
  const T* source = fused_add ? sum_row : in_row;
  T* out_row = static_cast<T*>(out.data) + row * out.row_stride;
  for (int64_t j = threadIdx.x; j < in.cols; j += blockDim.x) {
    out_row[j] =
        from_float<T>(to_float(source[j]) * inv_rms * load_float(weight.data, weight.dtype, j));
  }
}

}  // namespace

cudaError_t rms_norm(Matrix in, Matrix add, Matrix sum_out, Vector weight, float eps, Matrix out,
                     cudaStream_t stream) {
  if (in.rows == 0) return cudaSuccess;
  return with_element_type(in.dtype, [&](auto element) {
    using T = decltype(element);
    rms_norm_kernel<T><<<static_cast<unsigned>(in.rows), kThreads, 0, stream>>>(in, add, sum_out,
                                                                                weight, eps, out);
    return cudaGetLastError();
  });
}

}  // namespace pdserve::cuda
