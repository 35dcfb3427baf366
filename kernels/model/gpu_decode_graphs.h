// CUDA Graph buckets for decode steps: graphs are captured for batch sizes 1, 2, 4, ... up
// to 256, and a step of n sequences replays the smallest bucket holding n after its batch is
// padded. Padding sequences decode into a scratch KV block that no real sequence owns, so
// they cannot disturb real KV or outputs. Host-side and pure, tested without a GPU.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "common/core/status.h"
#include "kernels/model/forward_batch.h"

namespace pdserve {

inline constexpr int kMaxDecodeGraphBatch = 256;

// 1, 2, 4, ... up to the first power of two >= max_num_seqs, capped at kMaxDecodeGraphBatch;
// empty when max_num_seqs <= 0.
std::vector<int> decode_graph_buckets(int max_num_seqs);

// The smallest bucket >= num_seqs; nullopt when none holds it (the step then runs eagerly).
std::optional<int> choose_decode_bucket(std::span<const int> buckets, int num_seqs);

// Pads a decode-only batch (one new token per sequence) to `bucket` sequences: each padding
// sequence decodes token 0 at position 0 into slot scratch_block * block_size, sees that one
// key, and its block-table row is all scratch_block; its logits row is its own token.
// max_context_len becomes `graph_context_len` (the max_model_len the graph was captured
// with): the attention launch plan (split-K ranges) is frozen into the graph, so every
// replay must present the same maxima; the kernels read the true lengths from the arrays.
// InvalidArgument when the batch is not decode-only, is larger than the bucket, has a
// longer context than graph_context_len, or the scratch block or sizes are invalid.
Status pad_decode_batch(HostBatch& batch, int bucket, int scratch_block, int block_size,
                        int graph_context_len);

}  // namespace pdserve
