#include "kernels/linear_fp8_cuda.h"

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/cuda_check.h"
#include "kernels/fp8_cuda_kernels.h"
#include "kernels/linear_cuda.h"

namespace pdserve {
namespace {

struct DescDeleter {
  void operator()(cublasLtMatmulDesc_t desc) const { cublasLtMatmulDescDestroy(desc); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayout_t layout) const { cublasLtMatrixLayoutDestroy(layout); }
};
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreference_t pref) const { cublasLtMatmulPreferenceDestroy(pref); }
};
using Desc = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PreferenceDeleter>;

template <typename T>
cublasStatus_t set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                   const T& value) {
  return cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value));
}

Result<Layout> make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t layout = nullptr;
  PDS_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(rows),
                                                        static_cast<uint64_t>(cols), ld));
  return Layout(layout);
}

cuda::Matrix dev(MatrixView m) {
  return {m.data, m.dtype, m.rows, m.cols, m.row_stride};
}

std::string shape_text(const MatrixView& in, const Fp8WeightView& weight) {
  return "m " + std::to_string(in.rows) + ", n " + std::to_string(weight.shape.n) + ", k " +
         std::to_string(weight.shape.k);
}

// Column-major, as linear_cuda: out^T (n x m) = W (stored k x n, op T) * x^T (stored k x m).
Status block_scaled(const CudaFp8Context& context, MatrixView in, const Fp8WeightView& weight,
                    MatrixView out, void* workspace) {
  if (in.dtype != DType::kBF16 || out.dtype != DType::kBF16) {
    return unimplemented("linear (cuda, fp8 block-scaled): bf16 activations and output only");
  }
  const Fp8WeightShape& shape = weight.shape;
  const Fp8Workspace plan =
      plan_fp8_workspace(Fp8GemmPath::kBlockScaledLt, shape, in.rows, in.dtype);
  auto* base = static_cast<uint8_t*>(workspace);
  auto* activations = base + plan.activations_offset;
  auto* activation_scales = reinterpret_cast<float*>(base + plan.activation_scales_offset);
  auto* tile_scales = reinterpret_cast<float*>(base + plan.tile_scales_offset);
  PDS_CUDA_RETURN_IF_ERROR(
      cuda::quantize_fp8_token_groups(dev(in), activations, activation_scales, context.stream));
  PDS_CUDA_RETURN_IF_ERROR(cuda::fp8_tile_scales(
      weight.scales, shape.n, shape.k, shape.scale_block_n, shape.scale_block_k, tile_scales,
      fp8_tile_scale_stride(shape.k), context.stream));

  cublasLtMatmulDesc_t raw_desc = nullptr;
  PDS_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const Desc desc(raw_desc);
  const cublasOperation_t transpose = CUBLAS_OP_T;
  const cublasOperation_t keep = CUBLAS_OP_N;
  const int32_t weight_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const int32_t activation_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  const void* weight_scale_pointer = tile_scales;
  const void* activation_scale_pointer = activation_scales;
  PDS_CUBLAS_RETURN_IF_ERROR(set(raw_desc, CUBLASLT_MATMUL_DESC_TRANSA, transpose));
  PDS_CUBLAS_RETURN_IF_ERROR(set(raw_desc, CUBLASLT_MATMUL_DESC_TRANSB, keep));
  PDS_CUBLAS_RETURN_IF_ERROR(set(raw_desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, weight_mode));
  PDS_CUBLAS_RETURN_IF_ERROR(set(raw_desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, activation_mode));
  PDS_CUBLAS_RETURN_IF_ERROR(
      set(raw_desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, weight_scale_pointer));
  PDS_CUBLAS_RETURN_IF_ERROR(
      set(raw_desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, activation_scale_pointer));

  PDS_ASSIGN_OR_RETURN(Layout a, make_layout(CUDA_R_8F_E4M3, shape.k, shape.n, weight.row_stride));
  PDS_ASSIGN_OR_RETURN(Layout b, make_layout(CUDA_R_8F_E4M3, shape.k, in.rows, shape.k));
  PDS_ASSIGN_OR_RETURN(Layout d, make_layout(CUDA_R_16BF, shape.n, in.rows, out.row_stride));

  cublasLtMatmulPreference_t raw_preference = nullptr;
  PDS_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&raw_preference));
  const Preference preference(raw_preference);
  PDS_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      raw_preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &context.lt_workspace_bytes,
      sizeof(context.lt_workspace_bytes)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  PDS_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulAlgoGetHeuristic(context.lt, raw_desc, a.get(), b.get(),
                                                            d.get(), d.get(), raw_preference, 1,
                                                            &heuristic, &found));
  if (found == 0) {
    return unimplemented("linear (cuda, fp8): cuBLASLt has no block-scaled FP8 algorithm for " +
                         shape_text(in, weight));
  }
  const float alpha = 1.0f;
  const float beta = 0.0f;
  PDS_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmul(context.lt, raw_desc, &alpha, weight.data, a.get(), activations, b.get(),
                     &beta, out.data, d.get(), out.data, d.get(), &heuristic.algo,
                     context.lt_workspace, context.lt_workspace_bytes, context.stream));
  return {};
}

Status dequantized(const CudaFp8Context& context, MatrixView in, const Fp8WeightView& weight,
                   MatrixView out, void* workspace) {
  const Fp8Workspace plan =
      plan_fp8_workspace(Fp8GemmPath::kDequantize, weight.shape, in.rows, in.dtype);
  const MatrixView expanded =
      MatrixView::dense(static_cast<uint8_t*>(workspace) + plan.dequantized_offset, in.dtype,
                        weight.shape.n, weight.shape.k);
  PDS_CUDA_RETURN_IF_ERROR(cuda::dequantize_fp8(
      static_cast<const uint8_t*>(weight.data), weight.row_stride, weight.scales,
      weight.shape.scale_block_n, weight.shape.scale_block_k, dev(expanded), context.stream));
  return linear_cuda(context.cublas, in, expanded, out);
}

}  // namespace

Status linear_fp8_cuda(const CudaFp8Context& context, Fp8GemmPath path, MatrixView in,
                       const Fp8WeightView& weight, MatrixView out, void* workspace) {
  if (in.cols != weight.shape.k || out.cols != weight.shape.n || out.rows != in.rows) {
    return invalid_argument("linear (cuda, fp8): " + shape_text(in, weight) + " does not match");
  }
  if (in.rows == 0 || weight.shape.n == 0) return {};
  switch (path) {
    case Fp8GemmPath::kBlockScaledLt:
      return block_scaled(context, in, weight, out, workspace);
    case Fp8GemmPath::kDequantize:
      return dequantized(context, in, weight, out, workspace);
  }
  return invalid_argument("linear (cuda, fp8): unknown path");
}

}  // namespace pdserve
