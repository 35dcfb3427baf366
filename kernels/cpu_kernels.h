// CPU reference implementations of the backend operations (float32 activations). Each output
// element is produced by one thread in a fixed order, so results are bitwise independent of
// batch composition and thread count.
#pragma once

#include "kernels/backend.h"

namespace pdserve::cpu {

Status embedding(MatrixView table, const int32_t* ids, MatrixView out, int num_threads);
Status rms_norm(MatrixView in, VectorView weight, float eps, MatrixView out, int num_threads);
Status add_rms_norm(MatrixView x, MatrixView residual, VectorView weight, float eps,
                    int num_threads);
Status qk_norm_rope_kv_write(MatrixView q, MatrixView k, MatrixView v,
                             const QkNormRopeParams& params, const AttentionBatch& batch,
                             const KvCacheView& cache, int layer, int num_threads);
Status paged_attention(MatrixView q, const AttentionBatch& batch, const KvCacheView& cache,
                       int layer, int num_heads, float scale, MatrixView out, int num_threads);
Status silu_mul(MatrixView gate, MatrixView up, MatrixView out, int num_threads);
Status gather_rows(MatrixView in, const int32_t* indices, MatrixView out);

}  // namespace pdserve::cpu
