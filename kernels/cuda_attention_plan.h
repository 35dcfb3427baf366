// Launch plan of the CUDA paged-attention kernel, as a pure host function so that it is
// unit-tested without a GPU. Query rows are (token, query head) pairs; the heads of one KV
// head are packed into the same tile so that they share every K/V load (GQA). When the
// tiles alone cannot fill the device (decode: a few rows per sequence), the keys are split
// into ranges processed by separate blocks and merged afterwards (split-K, flash-decoding).
#pragma once

#include <cstddef>

#include "common/core/status.h"

namespace pdserve {

inline constexpr int kAttentionRowsPerTile = 32;  // query rows of one thread block
inline constexpr int kAttentionKeysPerTile = 32;  // keys staged in shared memory per step
inline constexpr int kAttentionMaxHeadDim = 256;  // head_dim must be a multiple of 32 up to it
inline constexpr int kAttentionMinKeysPerSplit = 256;
inline constexpr int kAttentionMaxSplits = 64;

struct AttentionShape {
  int num_seqs = 0;
  int num_tokens = 0;
  int max_query_len = 0;
  int max_context_len = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

struct AttentionPlan {
  int group = 0;                // query heads per KV head
  int row_tiles = 0;            // tiles of kAttentionRowsPerTile rows per (sequence, KV head)
  int num_splits = 1;           // key ranges per tile; 1 = no merge pass
  int keys_per_split = 0;       // a multiple of kAttentionKeysPerTile
  size_t workspace_floats = 0;  // partial results of the splits (0 when num_splits == 1)
  size_t shared_bytes = 0;      // dynamic shared memory per block
  int grid_x = 0;               // row_tiles * num_splits
};

// Unimplemented for a head_dim the kernel does not handle; InvalidArgument for a shape that
// is not a batch. `num_sms` is the device's multiprocessor count (the split target).
Result<AttentionPlan> plan_paged_attention(const AttentionShape& shape, int num_sms);

}  // namespace pdserve
