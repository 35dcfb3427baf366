// CUDA Graph buckets for decode steps: graphs are captured for batch sizes 1, 2, 4, ... up
// to 256 (and the batch limit itself when it is not a power of two), and a step of n
// sequences replays the smallest bucket holding n after its batch is padded. Padding sequences
// decode into a scratch KV block that no real sequence owns, so they cannot disturb real KV or
// outputs. Host-side and pure, tested without a GPU.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "common/core/status.h"
#include "kernels/model/forward_batch.h"

namespace pdserve {

inline constexpr int kMaxDecodeGraphBatch = 256;

// The powers of two below min(max_num_seqs, kMaxDecodeGraphBatch), then that minimum itself:
// never more sequences than the forward context holds. Empty when max_num_seqs <= 0.
std::vector<int> decode_graph_buckets(int max_num_seqs);

// The smallest bucket >= num_seqs; nullopt when none holds it (the step then runs eagerly).
std::optional<int> choose_decode_bucket(std::span<const int> buckets, int num_seqs);

// Pads a decode-only batch (one new token per sequence) to `bucket` sequences: each padding
// sequence decodes token 0 at position 0 into slot scratch_block * block_size, sees that one
// key, and its block-table row is all scratch_block; its logits row is its own token.
// Every scalar a graph freezes at capture is pinned to the graph's: max_context_len becomes
// `graph_context_len` (the max_model_len captured with; it fixes the split-K plan) and the
// block-table rows are re-strided to ceil(graph_context_len / block_size) entries. The
// kernels read the true lengths from the arrays.
// InvalidArgument when the batch is not decode-only, is larger than the bucket, has a
// longer context than graph_context_len, or the scratch block or sizes are invalid.
Status pad_decode_batch(HostBatch& batch, int bucket, int scratch_block, int block_size,
                        int graph_context_len);

}  // namespace pdserve
