// out = in @ W^T for an FP8 (e4m3, block-scaled) weight W on CUDA, by the path
// choose_fp8_gemm_path picked (fp8_linear_plan.h says what each path does and why):
// block-scaled: activations quantized per token per 128-element group, then one cuBLASLt FP8
// GEMM with BLK128x128 weight scales and VEC128 activation scales, bf16 out; dequantize: the
// weight expanded into the workspace in the activation dtype, then linear_cuda's GEMM.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/backend.h"
#include "kernels/fp8_linear_plan.h"

namespace pdserve {

// An FP8 weight in device memory: n x k codes `row_stride` bytes apart and its float scales
// (row-major [ceil(n/block_n)][ceil(k/block_k)], the checkpoint's weight_scale_inv).
struct Fp8WeightView {
  const void* data = nullptr;
  int64_t row_stride = 0;
  Fp8WeightShape shape;
  const float* scales = nullptr;
};

struct CudaFp8Context {
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t lt = nullptr;
  cudaStream_t stream = nullptr;
  void* lt_workspace = nullptr;  // cuBLASLt's own scratch (the backend's cuBLAS workspace)
  size_t lt_workspace_bytes = 0;
};

// `workspace` holds plan_fp8_workspace(path, weight.shape, in.rows, in.dtype).bytes; nothing
// is allocated. Unimplemented when cuBLASLt offers no algorithm for the block-scaled call.
Status linear_fp8_cuda(const CudaFp8Context& context, Fp8GemmPath path, MatrixView in,
                       const Fp8WeightView& weight, MatrixView out, void* workspace);

}  // namespace pdserve
