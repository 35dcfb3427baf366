// The draft pool's bookkeeping (kernels/model/draft_sequence_table.h): rollback to the longest
// common prefix, blocks given back, the starved state and its retry, checked against the
// table's invariants (every block free or held exactly once) after each step.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "kernels/model/draft_sequence_table.h"

namespace pdserve {
namespace {

std::vector<int32_t> iota_tokens(int count, int32_t first) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

TEST(DraftSequenceTable, RefusesAnEmptyPool) {
  EXPECT_EQ(DraftSequenceTable::create(0, 16).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DraftSequenceTable::create(4, 0).status().code(), StatusCode::kInvalidArgument);
}

TEST(DraftSequenceTable, RollsBackToTheCommonPrefixAndGivesBlocksBack) {
  DraftSequenceTable table = DraftSequenceTable::create(4, 4).value();
  const std::vector<int32_t> tokens = iota_tokens(10, 100);
  EXPECT_EQ(table.reserve(1, tokens, 12), 0);
  EXPECT_EQ(table.block_table(1).size(), 3u);
  EXPECT_EQ(table.num_free_blocks(), 1);
  const std::vector<int32_t> drafted = {7, 8};
  table.set_computed(1, tokens, drafted);  // 12 tokens with KV
  ASSERT_TRUE(table.check_invariants().ok());

  // The same 12 tokens again: all but the last keep their KV.
  std::vector<int32_t> same = tokens;
  same.insert(same.end(), drafted.begin(), drafted.end());
  EXPECT_EQ(table.reserve(1, same, 12), 11);
  // Diverging after 5 tokens, 8 positions: back to 5 tokens and 2 blocks.
  std::vector<int32_t> diverging(tokens.begin(), tokens.begin() + 5);
  diverging.push_back(-5);
  EXPECT_EQ(table.reserve(1, diverging, 8), 5);
  EXPECT_EQ(table.block_table(1).size(), 2u);
  EXPECT_EQ(table.num_free_blocks(), 2);
  ASSERT_TRUE(table.check_invariants().ok());
  // Nothing in common.
  EXPECT_EQ(table.reserve(1, iota_tokens(3, 900), 3), 0);
  EXPECT_EQ(table.block_table(1).size(), 1u);
  ASSERT_TRUE(table.check_invariants().ok());
}

TEST(DraftSequenceTable, AStarvedSequenceWaitsForARelease) {
  DraftSequenceTable table = DraftSequenceTable::create(4, 4).value();
  EXPECT_EQ(table.reserve(1, iota_tokens(8, 0), 8), 0);              // 2 blocks
  EXPECT_EQ(table.reserve(2, iota_tokens(9, 50), 9), std::nullopt);  // 3 blocks, 2 free
  EXPECT_EQ(table.state(2), DraftSeqState::kStarved);
  EXPECT_TRUE(table.block_table(2).empty());
  // Room or not, it is not tried again before a release.
  EXPECT_EQ(table.reserve(2, iota_tokens(2, 50), 2), std::nullopt);
  ASSERT_TRUE(table.check_invariants().ok());
  table.release(1);
  EXPECT_EQ(table.reserve(2, iota_tokens(9, 50), 9), 0);
  EXPECT_EQ(table.state(2), DraftSeqState::kHeld);
  // Growing past the pool starves a held sequence and frees its blocks.
  EXPECT_EQ(table.reserve(2, iota_tokens(9, 50), 17), std::nullopt);
  EXPECT_EQ(table.num_free_blocks(), 4);
  ASSERT_TRUE(table.check_invariants().ok());
  table.release(2);
  table.release(42);  // unknown
  EXPECT_EQ(table.num_sequences(), 0);
  EXPECT_EQ(table.num_free_blocks(), table.num_blocks());
  EXPECT_TRUE(table.check_invariants().ok());
}

}  // namespace
}  // namespace pdserve
