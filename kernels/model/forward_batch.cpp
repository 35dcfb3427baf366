#include "kernels/model/forward_batch.h"

#include <algorithm>
#include <string>

namespace pdserve {
namespace {

Status check_slice(const SequenceSlice& slice, size_t index, const BatchLimits& limits) {
  const std::string name = "sequence " + std::to_string(index);
  if (slice.tokens.empty()) return invalid_argument(name + ": no new tokens to compute");
  if (slice.num_cached < 0) return invalid_argument(name + ": negative cached length");
  const int64_t context =
      static_cast<int64_t>(slice.num_cached) + static_cast<int64_t>(slice.tokens.size());
  if (context > limits.max_position_embeddings) {
    return out_of_range(name + ": context of " + std::to_string(context) +
                        " tokens exceeds max_position_embeddings " +
                        std::to_string(limits.max_position_embeddings));
  }
  const int64_t blocks_needed = (context + limits.block_size - 1) / limits.block_size;
  if (static_cast<int64_t>(slice.block_table.size()) < blocks_needed) {
    return invalid_argument(name + ": block table has " + std::to_string(slice.block_table.size()) +
                            " blocks, " + std::to_string(blocks_needed) + " needed");
  }
  if (blocks_needed > limits.max_blocks_per_seq) {
    return out_of_range(name + ": needs " + std::to_string(blocks_needed) +
                        " blocks, above the per-sequence limit " +
                        std::to_string(limits.max_blocks_per_seq));
  }
  for (int64_t b = 0; b < blocks_needed; ++b) {
    if (slice.block_table[b] < 0 || slice.block_table[b] >= limits.num_blocks) {
      return invalid_argument(name + ": block id " + std::to_string(slice.block_table[b]) +
                              " outside the pool of " + std::to_string(limits.num_blocks));
    }
  }
  for (int32_t token : slice.tokens) {
    if (token < 0 || token >= limits.vocab_size) {
      return invalid_argument(name + ": token id " + std::to_string(token) +
                              " outside the vocabulary [0, " + std::to_string(limits.vocab_size) +
                              ")");
    }
  }
  return {};
}

}  // namespace

Status build_host_batch(std::span<const SequenceSlice> slices, const BatchLimits& limits,
                        HostBatch& batch) {
  if (slices.empty()) return invalid_argument("empty batch");
  if (static_cast<int>(slices.size()) > limits.max_num_seqs) {
    return out_of_range("batch of " + std::to_string(slices.size()) + " sequences exceeds " +
                        std::to_string(limits.max_num_seqs));
  }
  size_t total_tokens = 0;
  int max_blocks = 1;
  for (size_t i = 0; i < slices.size(); ++i) {
    PDS_RETURN_IF_ERROR(check_slice(slices[i], i, limits));
    total_tokens += slices[i].tokens.size();
    const int context = slices[i].num_cached + static_cast<int>(slices[i].tokens.size());
    max_blocks = std::max(max_blocks, (context + limits.block_size - 1) / limits.block_size);
  }
  if (total_tokens > static_cast<size_t>(limits.max_num_tokens)) {
    return out_of_range("batch of " + std::to_string(total_tokens) + " tokens exceeds " +
                        std::to_string(limits.max_num_tokens));
  }

  batch.num_seqs = static_cast<int>(slices.size());
  batch.num_tokens = static_cast<int>(total_tokens);
  batch.max_blocks_per_seq = max_blocks;
  batch.max_query_len = 0;
  batch.max_context_len = 0;
  batch.token_ids.clear();
  batch.positions.clear();
  batch.slot_mapping.clear();
  batch.query_start.assign(1, 0);
  batch.context_lens.clear();
  batch.logits_rows.clear();
  batch.block_tables.assign(slices.size() * static_cast<size_t>(max_blocks), 0);
  for (size_t i = 0; i < slices.size(); ++i) {
    const SequenceSlice& slice = slices[i];
    const int count = static_cast<int>(slice.tokens.size());
    const int context = slice.num_cached + count;
    for (int t = 0; t < count; ++t) {
      const int position = slice.num_cached + t;
      batch.token_ids.push_back(slice.tokens[static_cast<size_t>(t)]);
      batch.positions.push_back(position);
      batch.slot_mapping.push_back(
          slice.block_table[static_cast<size_t>(position / limits.block_size)] * limits.block_size +
          position % limits.block_size);
    }
    batch.query_start.push_back(batch.query_start.back() + count);
    batch.context_lens.push_back(context);
    batch.logits_rows.push_back(batch.query_start.back() - 1);
    const int blocks = (context + limits.block_size - 1) / limits.block_size;
    std::copy_n(slice.block_table.begin(), blocks,
                batch.block_tables.begin() + static_cast<std::ptrdiff_t>(i) * max_blocks);
    batch.max_query_len = std::max(batch.max_query_len, count);
    batch.max_context_len = std::max(batch.max_context_len, context);
  }
  return {};
}

}  // namespace pdserve
