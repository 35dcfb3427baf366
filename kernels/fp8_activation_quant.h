// Dynamic FP8 quantization of activations per token per group of 128 elements along k, as vLLM
// quantizes them for block-scaled FP8 checkpoints (per_token_group_quant_fp8): for each row
// and group, scale = max(amax, 1e-10) / 448 and q = e4m3(x / scale) rounded to nearest even,
// clamped to +-448. The host reference of the CUDA kernel (fp8_linear_cuda.cu), which uses
// the same IEEE-rounded operations, so the two agree bit for bit.
#pragma once

#include <cstdint>

namespace pdserve {

inline constexpr int64_t kFp8ActivationGroup = 128;
inline constexpr float kFp8ScaleFloor = 1e-10f;  // an all-zero group keeps a finite scale

// x: m rows of k floats, x_stride apart; q: m x k codes (row stride k); scales:
// float[ceil(k/128)][m] (rows contiguous within a group: cuBLASLt's VEC128 layout).
void quantize_fp8_token_groups_reference(const float* x, int64_t m, int64_t k, int64_t x_stride,
                                         uint8_t* q, float* scales);

}  // namespace pdserve
