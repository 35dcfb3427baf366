// Operands of one CPU linear layer (see linear_cpu.h). Kept free of other project headers so
// the instruction-set-specific kernel files can include it safely.
#pragma once

#include <cstdint>

#include "common/core/dtype_enum.h"

namespace pdserve {

struct LinearProblem {
  const float* x = nullptr;
  int64_t x_stride = 0;
  const void* w = nullptr;
  DType w_dtype = DType::kF32;
  int64_t w_stride = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
};

// The bf16 kernel converts activations in chunks of this many k (a multiple of 32); when k is
// longer it keeps each column's accumulators between chunks, for at most
// kMaxLinearColumnBlock columns per call.
constexpr int64_t kLinearActivationChunk = 4096;
constexpr int64_t kMaxLinearColumnBlock = 384;

// Each computes output columns [n_begin, n_end) for all rows on the calling thread, at one
// instruction-set level (kernels/cpu_isa.h); only call them when the CPU has that level.
void linear_cpu_columns_avx2(const LinearProblem& problem, int64_t n_begin, int64_t n_end);
void linear_cpu_columns_avx512(const LinearProblem& problem, int64_t n_begin, int64_t n_end);
// bf16 weights only.
void linear_cpu_columns_avx512_bf16(const LinearProblem& problem, int64_t n_begin, int64_t n_end);

}  // namespace pdserve
