#include "kernels/cuda_attention_plan.h"

#include <algorithm>
#include <string>

namespace pdserve {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

Result<AttentionPlan> plan_paged_attention(const AttentionShape& shape, int num_sms) {
  if (shape.head_dim <= 0 || shape.head_dim % 32 != 0 || shape.head_dim > kAttentionMaxHeadDim) {
    return unimplemented("paged_attention (cuda): head_dim " + std::to_string(shape.head_dim) +
                         " is not a multiple of 32 up to " + std::to_string(kAttentionMaxHeadDim));
  }
  if (shape.num_seqs <= 0 || shape.num_tokens < shape.num_seqs || shape.max_query_len <= 0 ||
      shape.max_context_len < shape.max_query_len || shape.num_kv_heads <= 0 ||
      shape.num_heads % shape.num_kv_heads != 0 || num_sms <= 0) {
    return invalid_argument("paged_attention (cuda): inconsistent batch shape (" +
                            std::to_string(shape.num_seqs) + " sequences, " +
                            std::to_string(shape.num_tokens) + " tokens, query " +
                            std::to_string(shape.max_query_len) + ", context " +
                            std::to_string(shape.max_context_len) + ")");
  }
  AttentionPlan plan;
  plan.group = shape.num_heads / shape.num_kv_heads;
  plan.row_tiles =
      static_cast<int>(ceil_div(int64_t{shape.max_query_len} * plan.group, kAttentionRowsPerTile));
  // Two blocks per multiprocessor keep it busy; split the keys only as far as that needs and
  // never below kAttentionMinKeysPerSplit keys, where the merge would cost more than it gains.
  const int64_t tile_blocks = int64_t{shape.num_seqs} * shape.num_kv_heads * plan.row_tiles;
  const int64_t wanted = ceil_div(2 * int64_t{num_sms}, tile_blocks);
  const int64_t most_useful = ceil_div(shape.max_context_len, kAttentionMinKeysPerSplit);
  const int64_t splits = std::clamp<int64_t>(std::min(wanted, most_useful), 1, kAttentionMaxSplits);
  plan.keys_per_split =
      static_cast<int>(ceil_div(ceil_div(shape.max_context_len, splits), kAttentionKeysPerTile) *
                       kAttentionKeysPerTile);
  plan.num_splits = static_cast<int>(ceil_div(shape.max_context_len, plan.keys_per_split));
  if (plan.num_splits > 1) {
    plan.workspace_floats =
        static_cast<size_t>(plan.num_splits) * static_cast<size_t>(shape.num_tokens) *
        static_cast<size_t>(shape.num_heads) * static_cast<size_t>(shape.head_dim + 2);
  }
  // Q tile, K tile (rows padded by one float against bank conflicts) and V tile, in float.
  plan.shared_bytes =
      sizeof(float) * (static_cast<size_t>(kAttentionRowsPerTile) * shape.head_dim +
                       static_cast<size_t>(kAttentionKeysPerTile) * (shape.head_dim + 1) +
                       static_cast<size_t>(kAttentionKeysPerTile) * shape.head_dim);
  plan.grid_x = plan.row_tiles * plan.num_splits;
  return plan;
}

}  // namespace pdserve
