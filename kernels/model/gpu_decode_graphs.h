// CUDA Graph buckets for decode steps. A graph is keyed by (batch bucket, context bucket):
// batch sizes 1, 2, 4, ... up to 256 (and the batch limit itself when it is not a power of
// two); contexts 1024, 2048, 4096, ... below max_model_len, then max_model_len. A decode step
// of n sequences whose longest context is c replays the graph of the smallest batch bucket
// holding n and the smallest context bucket holding c, after its batch is padded to both.
// Why context buckets: a graph freezes the attention kernel's split-K plan, which is chosen
// for the batch's longest context; frozen at max_model_len (40,960 for Qwen3), a 1k-context
// step would run in 1 or 2 of ~30 splits, leaving most of the device idle. Within a bucket the
// splits doing work are at least half as many as a plan for the step's own length would have
// (tested with the plan function). Padding sequences decode into a scratch KV block that no
// real sequence owns, so they cannot disturb real KV or outputs. Host-side and pure, tested
// without a GPU.
#pragma once

#include <compare>
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

// The shortest context bucket: below it the split-K plan has at most a few splits to lose.
inline constexpr int kMinDecodeGraphContext = 1024;

// Powers of two from kMinDecodeGraphContext below max_model_len, then max_model_len itself
// (only max_model_len when it is at most kMinDecodeGraphContext). Empty when max_model_len <= 0.
std::vector<int> decode_context_buckets(int max_model_len);

struct DecodeGraphKey {
  int batch = 0;    // sequences, padding included
  int context = 0;  // the graph's max_context_len (its split plan and block-table width)
  friend auto operator<=>(const DecodeGraphKey&, const DecodeGraphKey&) = default;
};

// The graph for a decode-only step of `num_seqs` sequences whose longest context is
// `max_context_len`; nullopt when no bucket holds it (the step then runs eagerly).
std::optional<DecodeGraphKey> choose_decode_graph(std::span<const int> batch_buckets,
                                                  std::span<const int> context_buckets,
                                                  int num_seqs, int max_context_len);

// Pads a decode-only batch (one new token per sequence) to `bucket` sequences: each padding
// sequence decodes token 0 at position 0 into slot scratch_block * block_size, sees that one
// key, and its block-table row is all scratch_block; its logits row is its own token.
// Every scalar a graph freezes at capture is pinned to the graph's: max_context_len becomes
// `graph_context_len` (the graph's context bucket; it fixes the split-K plan) and the
// block-table rows are re-strided to ceil(graph_context_len / block_size) entries. The
// kernels read the true lengths from the arrays.
// InvalidArgument when the batch is not decode-only, is larger than the bucket, has a
// longer context than graph_context_len, or the scratch block or sizes are invalid.
Status pad_decode_batch(HostBatch& batch, int bucket, int scratch_block, int block_size,
                        int graph_context_len);

}  // namespace pdserve
