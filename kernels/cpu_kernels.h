// CPU implementations of the backend operations (float32 activations), at the instruction-set
// level the backend was created with (kernels/cpu_isa.h; never kAuto here), on the backend's
// threads (cpu_thread_pool.h). Each output element is produced by one thread in a fixed order
// for its level, so results are bitwise independent of batch composition and thread count.
#pragma once

#include "kernels/backend.h"
#include "kernels/cpu_isa.h"
#include "kernels/cpu_thread_pool.h"

namespace pdserve::cpu {

Status embedding(MatrixView table, const int32_t* ids, MatrixView out, CpuThreadPool& pool);
Status rms_norm(MatrixView in, VectorView weight, float eps, MatrixView out, CpuThreadPool& pool,
                CpuIsa isa);
Status add_rms_norm(MatrixView x, MatrixView residual, VectorView weight, float eps,
                    CpuThreadPool& pool, CpuIsa isa);
Status qk_norm_rope_kv_write(MatrixView q, MatrixView k, MatrixView v,
                             const QkNormRopeParams& params, const AttentionBatch& batch,
                             const KvCacheView& cache, int layer, CpuThreadPool& pool, CpuIsa isa);
Status paged_attention(MatrixView q, const AttentionBatch& batch, const KvCacheView& cache,
                       int layer, int num_heads, float scale, MatrixView out, CpuThreadPool& pool,
                       CpuIsa isa);
Status silu_mul(MatrixView gate, MatrixView up, MatrixView out, CpuThreadPool& pool, CpuIsa isa);
Status gather_rows(MatrixView in, const int32_t* indices, MatrixView out);

// True for the levels whose row operations are vectorised (avx512, avx512_bf16).
inline bool uses_avx512(CpuIsa isa) {
  return isa == CpuIsa::kAvx512 || isa == CpuIsa::kAvx512Bf16;
}

}  // namespace pdserve::cpu
