#include "common/engine/block_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <unordered_set>
#include <vector>

#include "engine_test_util.h"

namespace pdserve {
namespace {

using testing::iota_tokens;
using testing::make_sequence;

BlockManager make_manager(int num_blocks, int block_size, BlockHashFn hash = &hash_block_tokens) {
  Result<BlockManager> manager = BlockManager::create(num_blocks, block_size, hash);
  EXPECT_TRUE(manager.ok()) << manager.status().to_string();
  return std::move(manager).value();
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<int32_t> table_of(const BlockManager& manager, SeqId id) {
  const std::span<const int32_t> table = manager.block_table(id);
  return {table.begin(), table.end()};
}

// Allocates `seq`, marks all its tokens computed and registers its full blocks.
void allocate_and_compute(BlockManager& manager, Sequence& seq) {
  ASSERT_TRUE(manager.allocate(seq).ok());
  seq.set_num_computed_tokens(seq.num_tokens());
  manager.cache_computed_blocks(seq);
}

void expect_counts(const BlockManager& manager, int used, int cached, int free) {
  EXPECT_EQ(manager.num_used_blocks(), used);
  EXPECT_EQ(manager.num_cached_blocks(), cached);
  EXPECT_EQ(manager.num_free_blocks(), free);
  const Status invariants = manager.check_invariants();
  EXPECT_TRUE(invariants.ok()) << invariants.to_string();
}

TEST(BlockManagerTest, RejectsBadShapes) {
  EXPECT_EQ(BlockManager::create(0, 16).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BlockManager::create(4, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BlockManager::create(4, 16, nullptr).status().code(), StatusCode::kInvalidArgument);
}

TEST(BlockManagerTest, AllocateAppendAndFreeAccountExactly) {
  BlockManager manager = make_manager(8, 4);
  Sequence seq = make_sequence(1, iota_tokens(10));
  ASSERT_TRUE(manager.can_allocate(seq));
  ASSERT_TRUE(manager.allocate(seq).ok());
  EXPECT_EQ(seq.num_computed_tokens(), 0);
  EXPECT_EQ(manager.block_table(1).size(), 3u);
  expect_counts(manager, 3, 0, 5);
  EXPECT_EQ(manager.allocate(seq).code(), StatusCode::kFailedPrecondition);

  // Tokens 11 and 12 fit in the third block; the 13th needs a fourth.
  seq.set_num_computed_tokens(10);
  for (int32_t token : {11, 12, 13}) {
    seq.append_output_token(token);
    ASSERT_TRUE(manager.can_append_slot(seq));
    ASSERT_TRUE(manager.append_slot(seq).ok());
  }
  EXPECT_EQ(manager.block_table(1).size(), 4u);
  expect_counts(manager, 4, 0, 4);

  manager.free(1);  // nothing was registered: every block is plainly free
  expect_counts(manager, 0, 0, 8);
  EXPECT_TRUE(manager.block_table(1).empty());
  EXPECT_EQ(manager.append_slot(seq).code(), StatusCode::kFailedPrecondition);
  manager.free(1);  // a second free is harmless
  expect_counts(manager, 0, 0, 8);
}

TEST(BlockManagerTest, RefusesWhenThePoolIsFull) {
  BlockManager manager = make_manager(3, 4);
  Sequence first = make_sequence(1, iota_tokens(8));
  Sequence second = make_sequence(2, iota_tokens(5, 100));
  ASSERT_TRUE(manager.allocate(first).ok());
  EXPECT_FALSE(manager.can_allocate(second));
  EXPECT_EQ(manager.allocate(second).code(), StatusCode::kResourceExhausted);
  expect_counts(manager, 2, 0, 1);

  // Growing into the last block works once, then the pool is exhausted.
  first.set_num_computed_tokens(8);
  first.append_output_token(9);
  ASSERT_TRUE(manager.append_slot(first).ok());
  for (int32_t token : {10, 11, 12}) {
    first.append_output_token(token);
    ASSERT_TRUE(manager.append_slot(first).ok());
  }
  first.append_output_token(13);
  EXPECT_FALSE(manager.can_append_slot(first));
  EXPECT_EQ(manager.append_slot(first).code(), StatusCode::kResourceExhausted);
  expect_counts(manager, 3, 0, 0);
}

TEST(BlockManagerTest, SequencesSharingASystemPromptReuseItsBlocks) {
  BlockManager manager = make_manager(16, 4);
  const std::vector<int32_t> system_prompt = iota_tokens(8, 1000);
  Sequence first = make_sequence(1, concat(system_prompt, {1, 2, 3, 4, 5}));
  allocate_and_compute(manager, first);
  EXPECT_EQ(manager.prefix_cache_stats().hit_tokens, 0);

  Sequence second = make_sequence(2, concat(system_prompt, {7, 8, 9}));
  ASSERT_TRUE(manager.allocate(second).ok());
  EXPECT_EQ(second.num_computed_tokens(), 8);
  const std::vector<int32_t> first_table = table_of(manager, 1);
  const std::vector<int32_t> second_table = table_of(manager, 2);
  ASSERT_EQ(second_table.size(), 3u);
  EXPECT_EQ(second_table[0], first_table[0]);
  EXPECT_EQ(second_table[1], first_table[1]);
  EXPECT_NE(second_table[2], first_table[2]);
  EXPECT_EQ(manager.ref_count(first_table[0]), 2);
  EXPECT_EQ(manager.ref_count(first_table[2]), 1);
  EXPECT_EQ(manager.prefix_cache_stats().queried_tokens, 13 + 11);
  EXPECT_EQ(manager.prefix_cache_stats().hit_tokens, 8);
  EXPECT_DOUBLE_EQ(manager.prefix_cache_stats().hit_rate(), 8.0 / 24.0);
  expect_counts(manager, 5, 0, 11);

  // The first sequence's own full blocks stay cached after it ends; its partial last block
  // holds nothing reusable.
  manager.free(1);
  expect_counts(manager, 3, 1, 12);
  manager.free(2);
  expect_counts(manager, 0, 3, 13);

  // A different first block shares nothing, even though later blocks are equal.
  Sequence other = make_sequence(3, concat(iota_tokens(4, 5000), iota_tokens(5, 1004)));
  ASSERT_TRUE(manager.allocate(other).ok());
  EXPECT_EQ(other.num_computed_tokens(), 0);
}

TEST(BlockManagerTest, FullPrefixHitStillComputesTheLastToken) {
  BlockManager manager = make_manager(16, 4);
  const std::vector<int32_t> prompt = iota_tokens(8);
  Sequence first = make_sequence(1, prompt);
  allocate_and_compute(manager, first);
  expect_counts(manager, 2, 0, 14);

  // Same 8 tokens: both blocks are cached, but the one holding the last token is recomputed
  // into a private block, so the model still produces logits for it.
  Sequence same = make_sequence(2, prompt);
  ASSERT_TRUE(manager.allocate(same).ok());
  EXPECT_EQ(same.num_computed_tokens(), 4);
  EXPECT_EQ(same.num_uncomputed_tokens(), 4);
  EXPECT_EQ(table_of(manager, 2)[0], table_of(manager, 1)[0]);
  EXPECT_NE(table_of(manager, 2)[1], table_of(manager, 1)[1]);
  // Its recomputed twin block is not registered a second time.
  same.set_num_computed_tokens(8);
  manager.cache_computed_blocks(same);
  manager.free(2);
  expect_counts(manager, 2, 0, 14);

  // One token past the cached blocks: only that token is left to compute.
  Sequence longer = make_sequence(3, concat(prompt, {99}));
  ASSERT_TRUE(manager.allocate(longer).ok());
  EXPECT_EQ(longer.num_computed_tokens(), 8);
  EXPECT_EQ(longer.num_uncomputed_tokens(), 1);

  // A one-token prompt never hits.
  Sequence single = make_sequence(4, {1});
  ASSERT_TRUE(manager.allocate(single).ok());
  EXPECT_EQ(single.num_computed_tokens(), 0);
}

TEST(BlockManagerTest, UncomputedBlocksAreNeverOffered) {
  BlockManager manager = make_manager(16, 4);
  Sequence prefilling = make_sequence(1, iota_tokens(13));
  ASSERT_TRUE(manager.allocate(prefilling).ok());
  prefilling.set_num_computed_tokens(6);  // one chunk done: only the first block is full
  manager.cache_computed_blocks(prefilling);

  Sequence follower = make_sequence(2, iota_tokens(13));
  ASSERT_TRUE(manager.allocate(follower).ok());
  EXPECT_EQ(follower.num_computed_tokens(), 4);
  expect_counts(manager, 7, 0, 9);
}

TEST(BlockManagerTest, CachedBlocksAreEvictedLeastRecentlyFreedFirst) {
  BlockManager manager = make_manager(4, 2);
  Sequence a = make_sequence(1, {1, 2, 3, 4});
  allocate_and_compute(manager, a);
  ASSERT_EQ(table_of(manager, 1), (std::vector<int32_t>{0, 1}));
  manager.free(1);  // tail first: LRU 1, 0
  Sequence b = make_sequence(2, {5, 6, 7, 8});
  allocate_and_compute(manager, b);
  ASSERT_EQ(table_of(manager, 2), (std::vector<int32_t>{2, 3}));
  manager.free(2);  // LRU 1, 0, 3, 2
  expect_counts(manager, 0, 4, 0);

  // Hits block 0 (leaving the LRU) and evicts the oldest, block 1, for its second block.
  Sequence probe = make_sequence(3, {1, 2, 9});
  ASSERT_TRUE(manager.allocate(probe).ok());
  EXPECT_EQ(probe.num_computed_tokens(), 2);
  EXPECT_EQ(table_of(manager, 3), (std::vector<int32_t>{0, 1}));
  manager.free(3);  // block 1 was never registered: free; block 0 is now the newest cached
  expect_counts(manager, 0, 3, 1);

  // Plain free blocks go first, then cached ones in LRU order: 3, 2, 0.
  Sequence big = make_sequence(4, iota_tokens(7, 20));
  ASSERT_TRUE(manager.allocate(big).ok());
  EXPECT_EQ(table_of(manager, 4), (std::vector<int32_t>{1, 3, 2, 0}));
  expect_counts(manager, 4, 0, 0);
  manager.free(4);

  // Everything cached before was evicted.
  Sequence again = make_sequence(5, {1, 2, 3, 4, 5});
  ASSERT_TRUE(manager.allocate(again).ok());
  EXPECT_EQ(again.num_computed_tokens(), 0);
}

TEST(BlockManagerTest, DuplicateBlocksChainOntoTheirRegisteredTwin) {
  BlockManager manager = make_manager(16, 4);
  const std::vector<int32_t> shared = iota_tokens(8);
  // Both admitted before either computed anything: no sharing, each computes its own copy.
  Sequence shorter = make_sequence(1, shared);
  Sequence longer = make_sequence(2, concat(shared, iota_tokens(5, 100)));
  ASSERT_TRUE(manager.allocate(shorter).ok());
  ASSERT_TRUE(manager.allocate(longer).ok());
  shorter.set_num_computed_tokens(8);
  manager.cache_computed_blocks(shorter);
  longer.set_num_computed_tokens(13);
  manager.cache_computed_blocks(longer);
  manager.free(1);
  manager.free(2);
  // shorter's two blocks and longer's third; longer's first two were twins.
  expect_counts(manager, 0, 3, 13);

  Sequence follower = make_sequence(3, concat(concat(shared, iota_tokens(4, 100)), {7}));
  ASSERT_TRUE(manager.allocate(follower).ok());
  EXPECT_EQ(follower.num_computed_tokens(), 12);
}

uint64_t always_colliding_hash(uint64_t, std::span<const int32_t>) {
  return 42;
}

TEST(BlockManagerTest, HashCollisionsNeverAliasDifferentContent) {
  BlockManager manager = make_manager(32, 2, &always_colliding_hash);
  Sequence a = make_sequence(1, {1, 1, 5, 5, 7});
  allocate_and_compute(manager, a);
  manager.free(1);

  // Same key everywhere; different first block: nothing may be shared.
  Sequence b = make_sequence(2, {2, 2, 5, 5, 8});
  ASSERT_TRUE(manager.allocate(b).ok());
  EXPECT_EQ(b.num_computed_tokens(), 0);
  b.set_num_computed_tokens(5);
  manager.cache_computed_blocks(b);
  manager.free(2);
  expect_counts(manager, 0, 4, 28);

  // Now [2 2][5 5] and [1 1][5 5] are both cached under one key: each prefix gets its own.
  Sequence c = make_sequence(3, {2, 2, 5, 5, 9});
  ASSERT_TRUE(manager.allocate(c).ok());
  EXPECT_EQ(c.num_computed_tokens(), 4);
  Sequence d = make_sequence(4, {1, 1, 5, 5, 9});
  ASSERT_TRUE(manager.allocate(d).ok());
  EXPECT_EQ(d.num_computed_tokens(), 4);
  const std::vector<int32_t> c_table = table_of(manager, 3);
  const std::vector<int32_t> d_table = table_of(manager, 4);
  EXPECT_NE(c_table[0], d_table[0]);
  EXPECT_NE(c_table[1], d_table[1]);

  const Status invariants = manager.check_invariants();
  EXPECT_TRUE(invariants.ok()) << invariants.to_string();
}

TEST(BlockManagerTest, ABlockIdReusedForNewContentDoesNotAdoptOldChildren) {
  BlockManager manager = make_manager(8, 2, &always_colliding_hash);
  // Admitted together: `twin` registers [1 1]; `owner` computes its own copy of [1 1], then
  // registers [5 5] chained onto twin's block 0.
  Sequence twin = make_sequence(1, {1, 1, 9});
  Sequence owner = make_sequence(2, {1, 1, 5, 5, 7});
  ASSERT_TRUE(manager.allocate(twin).ok());
  ASSERT_TRUE(manager.allocate(owner).ok());
  twin.set_num_computed_tokens(3);
  manager.cache_computed_blocks(twin);
  owner.set_num_computed_tokens(5);
  manager.cache_computed_blocks(owner);
  ASSERT_EQ(table_of(manager, 1)[0], 0);
  ASSERT_EQ(table_of(manager, 2)[1], 3);
  manager.free(1);
  manager.free(2);  // LRU: block 0 [1 1], then block 3 [5 5]
  expect_counts(manager, 0, 2, 6);

  // Block 0 is evicted and now holds [3 3]; block 3 still names block 0 as its parent.
  Sequence filler = make_sequence(3, iota_tokens(12, 10));
  ASSERT_TRUE(manager.allocate(filler).ok());
  Sequence reuser = make_sequence(4, {3, 3});
  allocate_and_compute(manager, reuser);
  ASSERT_EQ(table_of(manager, 4)[0], 0);
  manager.free(4);
  manager.free(3);

  Sequence probe = make_sequence(5, {3, 3, 5, 5, 9});
  ASSERT_TRUE(manager.allocate(probe).ok());
  EXPECT_EQ(probe.num_computed_tokens(), 2);
  EXPECT_NE(table_of(manager, 5)[1], 3);
  const Status invariants = manager.check_invariants();
  EXPECT_TRUE(invariants.ok()) << invariants.to_string();
}

TEST(BlockManagerTest, DefaultHashSeparatesRandomBlocksAndParents) {
  std::mt19937_64 rng(7);
  std::unordered_set<uint64_t> keys;
  constexpr int kBlocks = 50000;
  for (int i = 0; i < kBlocks; ++i) {
    std::vector<int32_t> tokens(16);
    for (int32_t& token : tokens) token = static_cast<int32_t>(rng() % 152000);
    keys.insert(hash_block_tokens(rng(), tokens));
  }
  EXPECT_EQ(keys.size(), static_cast<size_t>(kBlocks));
  // One token or the parent key changed, or the length: a different key.
  const std::vector<int32_t> base = iota_tokens(16);
  std::vector<int32_t> changed = base;
  changed[15] = 17;
  EXPECT_NE(hash_block_tokens(kRootBlockHash, base), hash_block_tokens(kRootBlockHash, changed));
  EXPECT_NE(hash_block_tokens(kRootBlockHash, base), hash_block_tokens(kRootBlockHash + 1, base));
  EXPECT_NE(hash_block_tokens(kRootBlockHash, std::span(base).first(15)),
            hash_block_tokens(kRootBlockHash, base));
}

TEST(BlockManagerTest, ItsJournalReportsTheKeysRegisteredAndEvicted) {
  BlockManager manager = make_manager(3, 4);
  Sequence first = make_sequence(1, iota_tokens(9, 0));  // two full blocks, then one token
  allocate_and_compute(manager, first);
  const uint64_t key0 = hash_block_tokens(kRootBlockHash, std::vector<int32_t>{0, 1, 2, 3});
  const uint64_t key1 = hash_block_tokens(key0, std::vector<int32_t>{4, 5, 6, 7});
  PrefixCacheChanges changes = manager.take_prefix_cache_changes();
  std::ranges::sort(changes.stored);
  std::vector<uint64_t> expected{key0, key1};
  std::ranges::sort(expected);
  EXPECT_EQ(changes.stored, expected);
  EXPECT_TRUE(changes.removed.empty());
  EXPECT_TRUE(manager.take_prefix_cache_changes().empty());

  manager.free(first.id());
  // A new prompt of three blocks evicts both cached blocks: their keys leave the cache.
  Sequence other = make_sequence(2, concat({100, 101, 102, 103, 104, 105, 106, 107}, {108}));
  ASSERT_TRUE(manager.allocate(other).ok());
  changes = manager.take_prefix_cache_changes();
  std::ranges::sort(changes.removed);
  EXPECT_EQ(changes.removed, expected);
  EXPECT_TRUE(changes.stored.empty());
}

TEST(BlockManagerTest, AnOverflowingJournalGivesASnapshotOfTheRegisteredKeys) {
  // More registrations than one report holds, never taken: the next take is a snapshot.
  const int blocks = static_cast<int>(kPrefixJournalCapacity) + 8;
  BlockManager manager = make_manager(blocks + 1, 1);
  Sequence seq = make_sequence(1, iota_tokens(blocks + 1));
  allocate_and_compute(manager, seq);
  const PrefixCacheChanges changes = manager.take_prefix_cache_changes();
  EXPECT_TRUE(changes.reset);
  EXPECT_EQ(changes.stored.size(), kPrefixJournalCapacity);
  EXPECT_TRUE(changes.removed.empty());
  EXPECT_EQ(manager.registered_keys().size(), static_cast<size_t>(blocks + 1));
}

TEST(BlockManagerTest, PinnedBlocksOutliveFreeUntilUnpinned) {
  BlockManager manager = make_manager(4, 4);
  Sequence sender = make_sequence(1, iota_tokens(12));
  allocate_and_compute(manager, sender);
  EXPECT_EQ(manager.pin(99).code(), StatusCode::kNotFound);
  EXPECT_EQ(manager.unpin(1).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(manager.pin(1).ok());
  ASSERT_TRUE(manager.pin(1).ok());

  manager.free(1);  // e.g. finished while its KV is still being sent
  expect_counts(manager, 3, 0, 1);
  EXPECT_EQ(manager.block_table(1).size(), 3u);
  // Its blocks are neither reused nor offered: a sequence needing two blocks cannot start,
  // and the cached prefix is still held, not shared out of a freed table.
  Sequence other = make_sequence(2, iota_tokens(8, 500));
  EXPECT_FALSE(manager.can_allocate(other));
  EXPECT_FALSE(manager.can_allocate(sender));

  ASSERT_TRUE(manager.unpin(1).ok());
  expect_counts(manager, 3, 0, 1);
  ASSERT_TRUE(manager.unpin(1).ok());  // the last pin releases the deferred free
  expect_counts(manager, 0, 3, 1);
  EXPECT_EQ(manager.unpin(1).code(), StatusCode::kNotFound);
  EXPECT_TRUE(manager.can_allocate(other));

  // Unpinned before any free: free then acts at once.
  Sequence later = make_sequence(3, iota_tokens(4, 900));
  ASSERT_TRUE(manager.allocate(later).ok());
  ASSERT_TRUE(manager.pin(3).ok());
  ASSERT_TRUE(manager.unpin(3).ok());
  manager.free(3);
  EXPECT_FALSE(manager.has_table(3));
  expect_counts(manager, 0, 3, 1);
}

}  // namespace
}  // namespace pdserve
