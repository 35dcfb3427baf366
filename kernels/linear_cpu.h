// CPU linear layer: y[m, n] = x[m, k] . w[n, k]^T with float32 activations and bf16, f16 or
// f32 weights, FP32 accumulation.
//
// Determinism contract: every output element is computed by one thread with one fixed
// reduction order (eight interleaved partial sums over k, fused multiply-add, a fixed
// pairwise combine, then the k % 8 tail), whatever m, the tiling or the thread count. The
// AVX2 path and the portable path give bitwise identical results.
#pragma once

#include "common/core/status.h"
#include "kernels/linear_problem.h"

namespace pdserve {

Status linear_cpu(const LinearProblem& problem, int num_threads);

// Computes output columns [n_begin, n_end) for all rows on the calling thread.
void linear_cpu_columns_portable(const LinearProblem& problem, int64_t n_begin, int64_t n_end);
bool cpu_has_avx2_fma();

}  // namespace pdserve
