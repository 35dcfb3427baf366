#include "kernels/fp8_linear_plan.h"

#include <algorithm>

#include "common/core/dtype.h"

namespace pdserve {
namespace {

constexpr size_t kAlign = 256;

size_t align_up(size_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// A 128-wide tile along a dimension of `size` lies inside one scale block of `block`.
bool tiles_fit(int64_t block, int64_t size) {
  return block >= size || (block > 0 && block % kFp8ScaleBlock == 0);
}

}  // namespace

const char* fp8_gemm_path_name(Fp8GemmPath path) {
  switch (path) {
    case Fp8GemmPath::kBlockScaledLt:
      return "cublaslt-block-scaled";
    case Fp8GemmPath::kDequantize:
      return "dequantize";
  }
  return "unknown";
}

Fp8GemmChoice choose_fp8_gemm_path(const Fp8WeightShape& weight, const Fp8Device& device,
                                   DType activation_dtype, DType out_dtype) {
  const auto fallback = [](std::string reason) {
    return Fp8GemmChoice{Fp8GemmPath::kDequantize, std::move(reason)};
  };
  const std::string cc = std::to_string(device.major) + "." + std::to_string(device.minor);
  if (device.major != 9 || device.minor != 0) {
    return fallback("compute capability " + cc +
                    ": cuBLASLt's float block scaling runs on 9.0 (Hopper) only");
  }
  if (device.cublaslt_version < kCublasLtBlockScalingVersion) {
    return fallback("cuBLASLt " + std::to_string(device.cublaslt_version) +
                    " predates block scaling (12.9)");
  }
  if (activation_dtype != DType::kBF16 || out_dtype != DType::kBF16) {
    return fallback("activations " + std::string(dtype_name(activation_dtype)) + ", output " +
                    std::string(dtype_name(out_dtype)) +
                    ": the block-scaled GEMM computes bf16 to bf16");
  }
  if (weight.n % 16 != 0 || weight.k % 16 != 0) {
    return fallback("n " + std::to_string(weight.n) + ", k " + std::to_string(weight.k) +
                    ": FP8 tensor cores need multiples of 16");
  }
  if (!tiles_fit(weight.scale_block_n, weight.n) || !tiles_fit(weight.scale_block_k, weight.k)) {
    return fallback("scale blocks " + std::to_string(weight.scale_block_n) + "x" +
                    std::to_string(weight.scale_block_k) + " do not hold whole 128x128 tiles");
  }
  return {Fp8GemmPath::kBlockScaledLt, "compute capability 9.0, cuBLASLt block scaling"};
}

int64_t fp8_tile_scale_stride(int64_t k) {
  return ceil_div(ceil_div(k, kFp8ScaleBlock), 4) * 4;
}

std::vector<float> fp8_tile_scales(const Fp8WeightShape& weight, const float* scales) {
  const int64_t tile_rows = ceil_div(weight.n, kFp8ScaleBlock);
  const int64_t tile_cols = ceil_div(weight.k, kFp8ScaleBlock);
  const int64_t stride = fp8_tile_scale_stride(weight.k);
  const int64_t scale_cols = ceil_div(weight.k, weight.scale_block_k);
  std::vector<float> grid(static_cast<size_t>(tile_rows * stride), 0.0f);
  for (int64_t ti = 0; ti < tile_rows; ++ti) {
    for (int64_t tj = 0; tj < tile_cols; ++tj) {
      const int64_t block_row = ti * kFp8ScaleBlock / weight.scale_block_n;
      const int64_t block_col = tj * kFp8ScaleBlock / weight.scale_block_k;
      grid[static_cast<size_t>(ti * stride + tj)] = scales[block_row * scale_cols + block_col];
    }
  }
  return grid;
}

Fp8Workspace plan_fp8_workspace(Fp8GemmPath path, const Fp8WeightShape& weight, int64_t m,
                                DType activation_dtype) {
  Fp8Workspace plan;
  size_t used = 0;
  const auto take = [&used](size_t bytes) {
    const size_t offset = used;
    used += align_up(std::max<size_t>(bytes, 1));
    return offset;
  };
  if (path == Fp8GemmPath::kBlockScaledLt) {
    const auto groups = static_cast<size_t>(ceil_div(weight.k, kFp8ScaleBlock));
    plan.activations_offset = take(static_cast<size_t>(m * weight.k));
    plan.activation_scales_offset = take(groups * static_cast<size_t>(m) * sizeof(float));
    plan.tile_scales_offset = take(
        static_cast<size_t>(ceil_div(weight.n, kFp8ScaleBlock) * fp8_tile_scale_stride(weight.k)) *
        sizeof(float));
  } else {
    plan.dequantized_offset =
        take(static_cast<size_t>(weight.n * weight.k) * dtype_size(activation_dtype));
  }
  plan.bytes = used;
  return plan;
}

}  // namespace pdserve
