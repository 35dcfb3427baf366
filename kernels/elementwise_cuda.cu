// Embedding lookup, SwiGLU activation and row gather on CUDA, one instance per element type.
#include <algorithm>

#include "kernels/cuda_common.cuh"
#include "kernels/cuda_kernels.h"

namespace pdserve::cuda {
namespace {

constexpr int kThreads = 256;

int grid_for(int64_t count) {
  return static_cast<int>(std::min<int64_t>((count + kThreads - 1) / kThreads, 65535 * 8));
}

// One block per output row: a bad index marks the error word and leaves the row unwritten.
template <typename T>
__global__ void copy_rows_kernel(Matrix in, const int32_t* indices, Matrix out,
                                 unsigned* error_word, unsigned error_bit) {
  const int64_t row = blockIdx.x;
  const int32_t source = indices[row];
  if (source < 0 || source >= in.rows) {
    if (threadIdx.x == 0) atomicOr(error_word, error_bit);
    return;
  }
  const T* from = static_cast<const T*>(in.data) + source * in.row_stride;
  T* to = static_cast<T*>(out.data) + row * out.row_stride;
  for (int64_t j = threadIdx.x; j < out.cols; j += blockDim.x) to[j] = from[j];
}

template <typename T>
__global__ void silu_mul_kernel(Matrix gate, Matrix up, Matrix out) {
  const int64_t count = out.rows * out.cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / out.cols;
    const int64_t c = i % out.cols;
    const float g = to_float(static_cast<const T*>(gate.data)[r * gate.row_stride + c]);
    const float u = to_float(static_cast<const T*>(up.data)[r * up.row_stride + c]);
    static_cast<T*>(out.data)[r * out.row_stride + c] = from_float<T>(g / (1.0f + expf(-g)) * u);
  }
}

cudaError_t copy_rows(Matrix in, const int32_t* indices, Matrix out, unsigned* error_word,
                      unsigned error_bit, cudaStream_t stream) {
  if (out.rows == 0) return cudaSuccess;
  return with_element_type(out.dtype, [&](auto element) {
    using T = decltype(element);
    copy_rows_kernel<T><<<static_cast<unsigned>(out.rows), kThreads, 0, stream>>>(
        in, indices, out, error_word, error_bit);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t embedding(Matrix table, const int32_t* ids, Matrix out, unsigned* error_word,
                      cudaStream_t stream) {
  return copy_rows(table, ids, out, error_word, kTokenIdOutOfRange, stream);
}

cudaError_t gather_rows(Matrix in, const int32_t* indices, Matrix out, unsigned* error_word,
                        cudaStream_t stream) {
  return copy_rows(in, indices, out, error_word, kRowIndexOutOfRange, stream);
}

cudaError_t silu_mul(Matrix gate, Matrix up, Matrix out, cudaStream_t stream) {
  const int64_t count = out.rows * out.cols;
  if (count == 0) return cudaSuccess;
  return with_element_type(out.dtype, [&](auto element) {
    using T = decltype(element);
    silu_mul_kernel<T><<<grid_for(count), kThreads, 0, stream>>>(gate, up, out);
    return cudaGetLastError();
  });
}

}  // namespace pdserve::cuda
