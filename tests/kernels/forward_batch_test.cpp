#include "kernels/model/forward_batch.h"

#include <gtest/gtest.h>

namespace pdserve {
namespace {

BatchLimits limits() {
  BatchLimits l;
  l.max_num_tokens = 64;
  l.max_num_seqs = 4;
  l.max_blocks_per_seq = 8;
  l.block_size = 4;
  l.num_blocks = 16;
  l.vocab_size = 100;
  l.max_position_embeddings = 32;
  return l;
}

TEST(ForwardBatch, PacksPrefillChunkAndDecodeTogether) {
  const std::vector<int32_t> prompt_chunk = {5, 6, 7};     // positions 4..6 after 4 cached
  const std::vector<int32_t> decode_token = {9};           // position 9 after 9 cached
  const std::vector<int32_t> table_a = {3, 8};
  const std::vector<int32_t> table_b = {1, 0, 15};
  const SequenceSlice slices[] = {{prompt_chunk, 4, table_a}, {decode_token, 9, table_b}};
  HostBatch batch;
  ASSERT_TRUE(build_host_batch(slices, limits(), batch).ok());
  EXPECT_EQ(batch.num_tokens, 4);
  EXPECT_EQ(batch.token_ids, (std::vector<int32_t>{5, 6, 7, 9}));
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{4, 5, 6, 9}));
  // slot = block_table[pos / 4] * 4 + pos % 4
  EXPECT_EQ(batch.slot_mapping, (std::vector<int32_t>{32, 33, 34, 61}));
  EXPECT_EQ(batch.query_start, (std::vector<int32_t>{0, 3, 4}));
  EXPECT_EQ(batch.context_lens, (std::vector<int32_t>{7, 10}));
  EXPECT_EQ(batch.logits_rows, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(batch.max_blocks_per_seq, 3);
  EXPECT_EQ(batch.block_tables, (std::vector<int32_t>{3, 8, 0, 1, 0, 15}));
  EXPECT_EQ(batch.max_query_len, 3);
  EXPECT_EQ(batch.max_context_len, 10);
}

TEST(ForwardBatch, RejectsWhatTheKernelsCannotRun) {
  const std::vector<int32_t> tokens = {1, 2};
  const std::vector<int32_t> empty;
  const std::vector<int32_t> one_block = {0};
  const std::vector<int32_t> table = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  HostBatch batch;
  const auto status_of = [&](SequenceSlice slice) {
    return build_host_batch({&slice, 1}, limits(), batch).code();
  };
  EXPECT_EQ(status_of({empty, 0, table}), StatusCode::kInvalidArgument);      // nothing to compute
  EXPECT_EQ(status_of({tokens, 3, one_block}), StatusCode::kInvalidArgument); // block table too short
  EXPECT_EQ(status_of({tokens, 31, table}), StatusCode::kOutOfRange);         // past max positions
  const std::vector<int32_t> bad_id = {100};
  EXPECT_EQ(status_of({bad_id, 0, table}), StatusCode::kInvalidArgument);
  const std::vector<int32_t> bad_block = {16};
  EXPECT_EQ(status_of({tokens, 0, bad_block}), StatusCode::kInvalidArgument);
  EXPECT_EQ(build_host_batch({}, limits(), batch).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve
