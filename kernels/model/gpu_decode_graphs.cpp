#include "kernels/model/gpu_decode_graphs.h"

#include <algorithm>
#include <string>
#include <vector>

namespace pdserve {

std::vector<int> decode_graph_buckets(int max_num_seqs) {
  std::vector<int> buckets;
  const int largest = std::min(max_num_seqs, kMaxDecodeGraphBatch);
  for (int size = 1; size < largest; size *= 2) buckets.push_back(size);
  if (largest > 0) buckets.push_back(largest);
  return buckets;
}

std::optional<int> choose_decode_bucket(std::span<const int> buckets, int num_seqs) {
  if (num_seqs <= 0) return std::nullopt;
  for (int bucket : buckets) {
    if (bucket >= num_seqs) return bucket;
  }
  return std::nullopt;
}

std::vector<int> decode_context_buckets(int max_model_len) {
  std::vector<int> buckets;
  for (int64_t length = kMinDecodeGraphContext; length < max_model_len; length *= 2) {
    buckets.push_back(static_cast<int>(length));
  }
  if (max_model_len > 0) buckets.push_back(max_model_len);
  return buckets;
}

std::optional<DecodeGraphKey> choose_decode_graph(std::span<const int> batch_buckets,
                                                  std::span<const int> context_buckets,
                                                  int num_seqs, int max_context_len) {
  const std::optional<int> batch = choose_decode_bucket(batch_buckets, num_seqs);
  if (!batch || max_context_len <= 0) return std::nullopt;
  for (int context : context_buckets) {
    if (context >= max_context_len) return DecodeGraphKey{*batch, context};
  }
  return std::nullopt;
}

Status pad_decode_batch(HostBatch& batch, int bucket, int scratch_block, int block_size,
                        int graph_context_len) {
  if (batch.num_tokens != batch.num_seqs || batch.max_query_len > 1) {
    return invalid_argument("pad_decode_batch: " + std::to_string(batch.num_tokens) +
                            " tokens for " + std::to_string(batch.num_seqs) +
                            " sequences is not a decode-only batch");
  }
  if (bucket < batch.num_seqs) {
    return invalid_argument("pad_decode_batch: bucket " + std::to_string(bucket) +
                            " is smaller than the batch of " + std::to_string(batch.num_seqs));
  }
  if (scratch_block < 0 || block_size <= 0 || batch.max_blocks_per_seq <= 0) {
    return invalid_argument("pad_decode_batch: bad scratch block or block size");
  }
  if (batch.max_context_len > graph_context_len) {
    return invalid_argument("pad_decode_batch: context of " +
                            std::to_string(batch.max_context_len) + " tokens exceeds the graph's " +
                            std::to_string(graph_context_len));
  }
  const int graph_blocks = (graph_context_len + block_size - 1) / block_size;
  if (batch.max_blocks_per_seq > graph_blocks) {
    return invalid_argument("pad_decode_batch: block tables of " +
                            std::to_string(batch.max_blocks_per_seq) +
                            " entries exceed the graph's " + std::to_string(graph_blocks));
  }
  if (batch.max_blocks_per_seq < graph_blocks) {
    std::vector<int32_t> restrided(static_cast<size_t>(batch.num_seqs) * graph_blocks, 0);
    for (int s = 0; s < batch.num_seqs; ++s) {
      std::copy_n(batch.block_tables.begin() + int64_t{s} * batch.max_blocks_per_seq,
                  batch.max_blocks_per_seq, restrided.begin() + int64_t{s} * graph_blocks);
    }
    batch.block_tables = std::move(restrided);
    batch.max_blocks_per_seq = graph_blocks;
  }
  const int scratch_slot = scratch_block * block_size;
  for (int s = batch.num_seqs; s < bucket; ++s) {
    batch.token_ids.push_back(0);
    batch.positions.push_back(0);
    batch.slot_mapping.push_back(scratch_slot);
    batch.query_start.push_back(s + 1);
    batch.context_lens.push_back(1);
    batch.block_tables.insert(batch.block_tables.end(),
                              static_cast<size_t>(batch.max_blocks_per_seq), scratch_block);
    batch.logits_rows.push_back(s);
  }
  batch.num_seqs = std::max(batch.num_seqs, bucket);
  batch.num_tokens = batch.num_seqs;
  batch.max_query_len = 1;
  batch.max_context_len = graph_context_len;
  return {};
}

}  // namespace pdserve
