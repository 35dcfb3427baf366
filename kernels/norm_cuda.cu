// RMSNorm and the fused residual-add + RMSNorm on CUDA: one block per row, float sums.
#include "kernels/cuda_common.cuh"
#include "kernels/cuda_kernels.h"

namespace pdserve::cuda {
namespace {

constexpr int kThreads = 256;

// Pass 1 forms each element (in, or in + add rounded to sum_out's dtype, stored there) and
// the sum of squares; pass 2 rereads what pass 1 left and writes the normalized row. A thread
// touches the same columns in both passes, so in/out and add/sum_out may alias.
__global__ void rms_norm_kernel(Matrix in, Matrix add, Matrix sum_out, Vector weight, float eps,
                                Matrix out) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const bool fused_add = add.data != nullptr;
  float sum_squares = 0.0f;
  for (int64_t j = threadIdx.x; j < in.cols; j += blockDim.x) {
    float value = load_float(in.data, in.dtype, row * in.row_stride + j);
    if (fused_add) {
      value = round_to(sum_out.dtype,
                       value + load_float(add.data, add.dtype, row * add.row_stride + j));
      store_float(sum_out.data, sum_out.dtype, row * sum_out.row_stride + j, value);
    }
    sum_squares += value * value;
  }
  const float total = block_sum(sum_squares, scratch);
  const float inv_rms = rsqrtf(total / static_cast<float>(in.cols) + eps);
  const Matrix source = fused_add ? sum_out : in;
  for (int64_t j = threadIdx.x; j < in.cols; j += blockDim.x) {
    const float value = load_float(source.data, source.dtype, row * source.row_stride + j);
    store_float(out.data, out.dtype, row * out.row_stride + j,
                value * inv_rms * load_float(weight.data, weight.dtype, j));
  }
}

}  // namespace

cudaError_t rms_norm(Matrix in, Matrix add, Matrix sum_out, Vector weight, float eps, Matrix out,
                     cudaStream_t stream) {
  if (in.rows == 0) return cudaSuccess;
  rms_norm_kernel<<<static_cast<unsigned>(in.rows), kThreads, 0, stream>>>(in, add, sum_out, weight,
                                                                           eps, out);
  return cudaGetLastError();
}

}  // namespace pdserve::cuda
