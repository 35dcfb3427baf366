#include "kernels/linear_cuda.h"

#include <string>

#include "kernels/cuda_check.h"

namespace pdserve {
namespace {

Result<cudaDataType_t> cuda_type(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF8E4M3:  // needs its scales: not a plain GEMM operand
      break;
  }
  return invalid_argument("linear (cuda): unknown dtype");
}

}  // namespace

Status linear_cuda(cublasHandle_t handle, MatrixView in, MatrixView weight, MatrixView out) {
  if (in.dtype != weight.dtype || (out.dtype != in.dtype && out.dtype != DType::kF32)) {
    return unimplemented("linear (cuda): in " + std::string(dtype_name(in.dtype)) + ", weight " +
                         std::string(dtype_name(weight.dtype)) + ", out " +
                         std::string(dtype_name(out.dtype)) +
                         " (inputs must share a dtype; out is theirs or float32)");
  }
  if (in.rows == 0 || weight.rows == 0) return {};
  PDS_ASSIGN_OR_RETURN(cudaDataType_t in_type, cuda_type(in.dtype));
  PDS_ASSIGN_OR_RETURN(cudaDataType_t out_type, cuda_type(out.dtype));
  // float32 inputs are multiplied in float32 proper: the pedantic compute type forbids TF32
  // and reduced-precision reductions (the strict float32 mode relies on it). bf16 inputs
  // accumulate in float32.
  const cublasComputeType_t compute =
      in.dtype == DType::kF32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  // Row-major out[m, n] = in[m, k] @ W[n, k]^T is, column-major, out^T = W^T(op T) * in^T.
  const float alpha = 1.0f;
  const float beta = 0.0f;
  PDS_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
      handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(weight.rows), static_cast<int>(in.rows),
      static_cast<int>(in.cols), &alpha, weight.data, in_type, static_cast<int>(weight.row_stride),
      in.data, in_type, static_cast<int>(in.row_stride), &beta, out.data, out_type,
      static_cast<int>(out.row_stride), compute, CUBLAS_GEMM_DEFAULT));
  return {};
}

}  // namespace pdserve
