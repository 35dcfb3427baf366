// Row operations of the avx512 level (norms, RoPE, SiLU, bf16 KV stores), called by the
// generic CPU kernels after the level check. Plain declarations only (see linear_problem.h).
#pragma once

#include <cstdint>

#include "common/core/dtype_enum.h"

namespace pdserve::avx512 {

// out = in * inv_rms * weight with inv_rms = 1 / sqrt(mean(in^2) + eps), the mean square
// summed in double over 16 interleaved lanes (fixed tree). `out` may be `in`.
void rms_norm_row(const float* in, const void* weight, DType weight_dtype, float eps, int64_t n,
                  float* out);
// residual += x, then x = rms_norm(residual) * weight.
void add_rms_norm_row(float* x, float* residual, const void* weight, DType weight_dtype, float eps,
                      int64_t n);
// In place on one head: RMSNorm, then the HF rotate-half rotation by cos/sin (double).
void norm_rope_head(float* head, const void* norm_weight, DType weight_dtype, float eps,
                    int head_dim, const double* cos_table, const double* sin_table);
// out = silu(gate) * up.
void silu_mul_row(const float* gate, const float* up, float* out, int64_t n);
// float32 -> bf16, bit-identical to float_to_bf16.
void store_bf16(const float* src, uint16_t* dst, int64_t n);

}  // namespace pdserve::avx512
