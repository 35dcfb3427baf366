// CPU linear layer: y[m, n] = x[m, k] . w[n, k]^T with float32 activations and bf16, f16 or
// f32 weights, FP32 accumulation.
//
// Determinism contract: at a given instruction-set level (kernels/cpu_isa.h) every output
// element is computed by one thread with one fixed reduction order, whatever m, the tiling or
// the thread count. portable and avx2: eight interleaved partial sums over k, fused
// multiply-add, a fixed pairwise combine, then the k % 8 tail (the two agree bitwise).
// avx512 and avx512_bf16: see linear_cpu_avx512.cpp and linear_cpu_avx512bf16.cpp.
#pragma once

#include "common/core/status.h"
#include "kernels/cpu_isa.h"
#include "kernels/cpu_thread_pool.h"
#include "kernels/linear_problem.h"

namespace pdserve {

// Column blocks are shared among the pool's threads. `isa` must be a level the CPU supports
// (resolve_cpu_isa), not kAuto.
Status linear_cpu(const LinearProblem& problem, CpuThreadPool& pool, CpuIsa isa);

// Computes output columns [n_begin, n_end) for all rows on the calling thread.
void linear_cpu_columns_portable(const LinearProblem& problem, int64_t n_begin, int64_t n_end);

}  // namespace pdserve
