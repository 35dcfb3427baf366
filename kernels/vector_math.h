// Short-vector primitives shared by the CPU kernels, with the same fixed reduction order as
// linear_cpu: eight interleaved fused-multiply-add partial sums, combined
// ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)), then the tail. AVX2 and portable paths agree bitwise.
// Kept free of other project headers (see linear_problem.h).
#pragma once

#include <cstdint>

#include "common/core/dtype_enum.h"

namespace pdserve {

// sum_i a[i] * b[i]; b is f32, bf16 or f16.
float dot_f32(const float* a, const void* b, DType b_dtype, int64_t n);
// y[i] = fma(alpha, x[i], y[i]); x is f32, bf16 or f16.
void axpy_f32(float alpha, const void* x, DType x_dtype, float* y, int64_t n);

namespace portable {
float dot_f32(const float* a, const void* b, DType b_dtype, int64_t n);
void axpy_f32(float alpha, const void* x, DType x_dtype, float* y, int64_t n);
}  // namespace portable

namespace avx2 {
float dot_f32(const float* a, const void* b, DType b_dtype, int64_t n);
void axpy_f32(float alpha, const void* x, DType x_dtype, float* y, int64_t n);
}  // namespace avx2

}  // namespace pdserve
