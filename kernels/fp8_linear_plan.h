// How the CUDA backend multiplies by an FP8 (e4m3) weight (issue #31 item 3): the choice of
// path by device and weight format, the workspace each path needs, and the scale layouts
// cuBLASLt is given. Host-only and free of CUDA headers, so it is unit-tested everywhere.
//
// What this CUDA 13.0 (cuBLASLt 13.0) offers, read from cublasLt.h and NVIDIA's documentation
// (cuBLAS 12.9 release: "channel- and block-scaled FP8 matmuls on Hopper"):
// - CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F (one float per 128 elements along k) and
//   CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F (one float per 128x128 block), set through
//   CUBLASLT_MATMUL_DESC_A/B_SCALE_MODE, exist since cuBLASLt 12.9 and run on compute
//   capability 9.0 (Hopper) only, with "TN" operands (A transposed, B not) and bf16 output.
//   Blackwell (10.x, 12.x) block-scales only with MX formats (VEC32_UE8M0: e8m0 scales per 32
//   elements), which are not the checkpoint's float scales; Ada (8.9) has per-tensor scalars.
// - The scale layouts (as PyTorch's _scaled_mm checks them before handing them to cuBLASLt):
//   VEC128 on an (m x k) row-major operand: float[ceil(k/128)][m], m contiguous;
//   BLK128x128 on an (n x k) row-major operand: float[ceil(n/128)][ld], ld = ceil(k/128)
//   rounded up to 4 (16-byte aligned rows).
// So on 9.0 the weight (A, its 128x128 scales, the checkpoint's weight_scale_inv re-laid per
// call into that padded grid) meets activations quantized per token per 128-element group (B,
// VEC128: vLLM's per_token_group_quant_fp8 for this format). Everywhere else, and for scale
// blocks that are not whole 128x128 tiles (per-channel), the weight is dequantized into a bf16
// (strict mode: float32) scratch matrix reused by every layer and the existing cuBLAS GEMM
// runs: correct on every device, 2 bytes a weight element read twice more than it needs.
// Not yet run on a GPU: the cuBLASLt call and the layouts above are unverified until
// cuda_fp8_linear_test passes on one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/core/dtype_enum.h"

namespace pdserve {

// The cuBLASLt release that introduced VEC128 / BLK128x128 scaling (cublasLtGetVersion()).
inline constexpr size_t kCublasLtBlockScalingVersion = 120900;
// The group of activations one scale covers, and the side of a weight scale block, on the
// block-scaled path.
inline constexpr int64_t kFp8ScaleBlock = 128;

enum class Fp8GemmPath {
  kBlockScaledLt,  // cuBLASLt FP8 GEMM: BLK128x128 weight scales x VEC128 activation scales
  kDequantize,     // weight -> activation dtype into scratch, then the dense cuBLAS GEMM
};

const char* fp8_gemm_path_name(Fp8GemmPath path);

// An FP8 weight as the representation holds it: n x k e4m3, one float scale per
// scale_block_n x scale_block_k block (row-major [ceil(n/bn)][ceil(k/bk)]).
struct Fp8WeightShape {
  int64_t n = 0;
  int64_t k = 0;
  int64_t scale_block_n = 0;
  int64_t scale_block_k = 0;
};

struct Fp8Device {
  int major = 0;
  int minor = 0;
  size_t cublaslt_version = 0;
};

struct Fp8GemmChoice {
  Fp8GemmPath path = Fp8GemmPath::kDequantize;
  std::string reason;  // why this path (for logs and test messages)
};

// The block-scaled path when the device is 9.0 with cuBLASLt >= 12.9, the activations and
// the output are bf16, n and k are multiples of 16 (FP8 tensor-core alignment) and every
// 128x128 tile of the weight lies inside one scale block (128x128 blocks, multiples of them,
// or one per-tensor scale); the dequantize path otherwise.
Fp8GemmChoice choose_fp8_gemm_path(const Fp8WeightShape& weight, const Fp8Device& device,
                                   DType activation_dtype, DType out_dtype);

// The padded BLK128x128 grid's row length: ceil(k/128) rounded up to 4 floats.
int64_t fp8_tile_scale_stride(int64_t k);

// The weight's scales re-laid as cuBLASLt's BLK128x128 grid: [ceil(n/128)][stride], tile
// (ti, tj) taking the scale of the block holding its first element; padding is 0. Only for
// weights choose_fp8_gemm_path sends to the block-scaled path (the CUDA kernel that does the
// same per call is checked against this).
std::vector<float> fp8_tile_scales(const Fp8WeightShape& weight, const float* scales);

// Device workspace of one FP8 linear call with m activation rows, in bytes, with each part at
// a 256-byte aligned offset: block-scaled: quantized activations (m x k bytes), their scales
// (float[ceil(k/128)][m]) and the tile scale grid; dequantize: the n x k scratch matrix in
// the activation dtype.
struct Fp8Workspace {
  size_t activations_offset = 0;
  size_t activation_scales_offset = 0;
  size_t tile_scales_offset = 0;
  size_t dequantized_offset = 0;
  size_t bytes = 0;
};
Fp8Workspace plan_fp8_workspace(Fp8GemmPath path, const Fp8WeightShape& weight, int64_t m,
                                DType activation_dtype);

}  // namespace pdserve
