// Shape and dtype validation shared by every backend, so a malformed call fails the same way
// on the CPU and on CUDA instead of reading out of bounds.
#pragma once

#include "kernels/backend.h"

namespace pdserve {

Status check_embedding(MatrixView table, MatrixView out);
Status check_rms_norm(MatrixView in, VectorView weight, MatrixView out);
Status check_linear(MatrixView in, MatrixView weight, MatrixView out);
Status check_qk_norm_rope(MatrixView q, MatrixView k, MatrixView v, const QkNormRopeParams& params,
                          const AttentionBatch& batch, const KvCacheView& cache, int layer);
Status check_attention(MatrixView q, const AttentionBatch& batch, const KvCacheView& cache,
                       int layer, int num_heads, MatrixView out);
Status check_same_shape(MatrixView a, MatrixView b, const char* op);

}  // namespace pdserve
