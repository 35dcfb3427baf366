// Turns the sequences of one forward step into the packed batch arrays the kernels read:
// token ids, positions, KV slots, query offsets, context lengths, block tables and the rows
// whose logits are wanted. Host-side and device-independent.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/core/status.h"

namespace pdserve {

// One sequence's share of a step: its new tokens (a prompt, a chunk of one, or one decode
// token) placed after `num_cached` tokens already in the KV cache. The block table must cover
// num_cached + tokens.size() positions.
struct SequenceSlice {
  std::span<const int32_t> tokens;
  int num_cached = 0;
  std::span<const int32_t> block_table;
};

struct BatchLimits {
  int max_num_tokens = 0;
  int max_num_seqs = 0;
  int max_blocks_per_seq = 0;
  int block_size = 16;
  int num_blocks = 0;
  int vocab_size = 0;
  int max_position_embeddings = 0;
};

// Host arrays of a packed batch; the layout matches AttentionBatch.
struct HostBatch {
  int num_seqs = 0;
  int num_tokens = 0;
  int max_blocks_per_seq = 0;
  int max_query_len = 0;
  int max_context_len = 0;
  std::vector<int32_t> token_ids;
  std::vector<int32_t> positions;
  std::vector<int32_t> slot_mapping;
  std::vector<int32_t> query_start;
  std::vector<int32_t> context_lens;
  std::vector<int32_t> block_tables;  // num_seqs x max_blocks_per_seq, padded with 0
  std::vector<int32_t> logits_rows;   // the packed index of each sequence's last new token
};

// InvalidArgument / OutOfRange naming the sequence when a slice is empty, has ids outside the
// vocabulary, runs past max_position_embeddings, lacks blocks, or the batch exceeds limits.
Status build_host_batch(std::span<const SequenceSlice> slices, const BatchLimits& limits,
                        HostBatch& batch);

}  // namespace pdserve
