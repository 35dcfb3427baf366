// Short-vector primitives shared by the CPU kernels, with the same fixed reduction order as
// linear_cpu: eight interleaved fused-multiply-add partial sums, combined
// ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)), then the tail. AVX2 and portable paths agree bitwise;
// the attention of the portable and avx2 levels is built on them.
// Kept free of other project headers (see linear_problem.h).
#pragma once

#include <cstdint>

#include "common/core/dtype_enum.h"

namespace pdserve {

// dot_f32: sum_i a[i] * b[i]; axpy_f32: y[i] = fma(alpha, x[i], y[i]). b and x are f32, bf16,
// f16 or FP8 E4M3 (the code's value, unscaled). The avx2 versions need a CPU with that level
// (kernels/cpu_isa.h).
namespace portable {
float dot_f32(const float* a, const void* b, DType b_dtype, int64_t n);
void axpy_f32(float alpha, const void* x, DType x_dtype, float* y, int64_t n);
}  // namespace portable

namespace avx2 {
float dot_f32(const float* a, const void* b, DType b_dtype, int64_t n);
void axpy_f32(float alpha, const void* x, DType x_dtype, float* y, int64_t n);
}  // namespace avx2

}  // namespace pdserve
