// Cache-aware placement: the proxy's chain of a prompt's block keys is the nodes' chain, each
// node's key set stays bounded, and the costs rank as documented.
#include "proxy/routing/prefix_routing.h"

#include <gtest/gtest.h>

#include <numeric>
#include <span>
#include <vector>

#include "common/engine/block_hash.h"

namespace pdserve::proxy {
namespace {

std::vector<int32_t> tokens(int count, int32_t first = 0) {
  std::vector<int32_t> out(static_cast<size_t>(count));
  std::iota(out.begin(), out.end(), first);
  return out;
}

PrefixCacheReport stored(std::vector<uint64_t> keys, int block_size = 4) {
  return {block_size, false, std::move(keys), {}};
}

// The node's BlockManager registers its full blocks under these keys
// (BlockManagerTest.ItsJournalReportsTheKeysRegisteredAndEvicted checks the same chain there).
TEST(PrefixRoutingTest, TheProxysChainIsTheNodesChainOfBlockKeys) {
  const std::vector<int32_t> prompt = tokens(13);  // 3 full blocks, then 1 token
  const std::vector<uint64_t> chain = reusable_block_chain(prompt, 4);
  ASSERT_EQ(chain.size(), 3u);
  uint64_t parent = kRootBlockHash;
  for (size_t block = 0; block < 3; ++block) {
    parent = hash_block_tokens(parent, std::span(prompt).subspan(block * 4, 4));
    EXPECT_EQ(chain[block], parent) << "block " << block;
  }
}

TEST(PrefixRoutingTest, TheBlockOfTheLastTokenIsNeverCounted) {
  EXPECT_EQ(reusable_block_chain(tokens(12), 4).size(), 2u);  // the last token ends block 3
  EXPECT_EQ(reusable_block_chain(tokens(13), 4).size(), 3u);
  EXPECT_TRUE(reusable_block_chain(tokens(4), 4).empty());
  EXPECT_TRUE(reusable_block_chain({}, 4).empty());
  EXPECT_TRUE(reusable_block_chain(tokens(40), 0).empty());
  // Chained: the same block after a different prefix has another key.
  const std::vector<uint64_t> a = reusable_block_chain(tokens(9, 0), 4);
  std::vector<int32_t> other = tokens(9, 0);
  other[0] = 77;
  const std::vector<uint64_t> b = reusable_block_chain(other, 4);
  EXPECT_NE(a[1], b[1]);
}

// The leading keys of `chain` a node with these pool keys and no tiers holds.
size_t matched(const PrefixKeySet& keys, std::span<const uint64_t> chain) {
  return match_prefix(chain, keys, PrefixKeySet(0)).blocks();
}

TEST(PrefixRoutingTest, MatchStopsAtTheFirstMissingBlock) {
  const std::vector<uint64_t> chain = reusable_block_chain(tokens(17), 4);  // 4 keys
  PrefixKeySet keys(100);
  keys.apply(stored({chain[0], chain[1], chain[3]}));
  EXPECT_EQ(keys.block_size(), 4);
  EXPECT_EQ(matched(keys, chain), 2u);
  keys.apply({4, false, {}, {chain[0]}});
  EXPECT_EQ(matched(keys, chain), 0u);
  keys.apply({4, true, {chain[0], chain[1], chain[2]}, {}});  // a snapshot replaces all
  EXPECT_EQ(matched(keys, chain), 3u);
  EXPECT_EQ(keys.size(), 3u);
}

TEST(PrefixRoutingTest, AKeySetNeverHoldsMoreThanItsCapacityAndDropsTheLeastRecent) {
  PrefixKeySet keys(3);
  keys.apply(stored({1, 2, 3}));
  keys.touch(std::vector<uint64_t>{1}, 1);  // 1 is now the most recent; 2 the least
  keys.apply(stored({4}));
  EXPECT_EQ(keys.size(), 3u);
  EXPECT_EQ(matched(keys, std::vector<uint64_t>{2}), 0u);
  EXPECT_EQ(matched(keys, std::vector<uint64_t>{1}), 1u);
  std::vector<uint64_t> many(10'000);
  std::iota(many.begin(), many.end(), 100);
  keys.apply(stored(many));
  EXPECT_EQ(keys.size(), 3u);
  PrefixKeySet none(0);
  none.apply(stored({1, 2}));
  EXPECT_EQ(none.size(), 0u);
}

TEST(PrefixRoutingTest, DecodeCostWeighsTheHitAgainstKvUsageAndSequences) {
  const RoutingWeights weights;
  const DecodeCandidate idle{0.0, 0, 0.0};
  const DecodeCandidate holder{0.2, 3, 1.0};
  EXPECT_LT(decode_cost(holder, weights), decode_cost(idle, weights));
  // Ten more sequences outweigh a whole-prompt hit: the load spreads again.
  const DecodeCandidate crowded{0.0, 11, 1.0};
  EXPECT_GT(decode_cost(crowded, weights), decode_cost(idle, weights));
  RoutingWeights blind = weights;
  blind.prefix = 0.0;  // cache-unaware
  EXPECT_GT(decode_cost(holder, blind), decode_cost(idle, blind));
  EXPECT_DOUBLE_EQ(decode_cost({0.5, 2, 0.25}, weights), 0.5 + 0.2 - 0.25);
}

TEST(PrefixRoutingTest, PrefillCostIsTheWorkBeforeThisPromptInPromptLengths) {
  const RoutingWeights weights;
  // 1000-token prompt: a node with 500 queued tokens and a 90% hit beats an idle node.
  EXPECT_LT(prefill_cost({500, 0.9}, 1000, weights), prefill_cost({0, 0.0}, 1000, weights));
  // ...but not one with 1500 queued.
  EXPECT_GT(prefill_cost({1500, 0.9}, 1000, weights), prefill_cost({0, 0.0}, 1000, weights));
  EXPECT_DOUBLE_EQ(prefill_cost({10, 0.0}, 0, weights), 10.0);  // unknown length counts as 1
}

TEST(PrefixRoutingTest, PlacementFollowsTheUncachedTokensAndThePrefillQueue) {
  PlacementPolicy policy;
  policy.local_max_uncached_tokens = 64;
  policy.max_prefill_queue_tokens = 10'000;
  PlacementInput input;
  input.prompt_known = true;
  input.prefill_node = true;
  input.prompt_tokens = 330;  // 20 reusable blocks of 16
  input.block_size = 16;
  input.prompt_blocks = 20;
  const auto placed = [&](size_t hit, int64_t queue) {
    PlacementInput with = input;
    with.hit_blocks = hit;
    with.prefill_queue_tokens = queue;
    return choose_prefill_placement(with, policy);
  };
  EXPECT_EQ(placed(0, 0), PrefillPlacement::kRemote);
  EXPECT_EQ(placed(16, 0), PrefillPlacement::kRemote);   // 74 uncached
  EXPECT_EQ(placed(17, 0), PrefillPlacement::kLocal);    // 58 uncached
  EXPECT_EQ(placed(20, 0), PrefillPlacement::kCached);
  EXPECT_EQ(placed(0, 10'001), PrefillPlacement::kLocal);  // the prefill pool is behind
  EXPECT_EQ(placed(0, 10'000), PrefillPlacement::kRemote);
  PlacementInput unknown = input;
  unknown.prompt_known = false;
  EXPECT_EQ(choose_prefill_placement(unknown, policy), PrefillPlacement::kRemote);
  PlacementInput no_prefill = input;
  no_prefill.prefill_node = false;
  EXPECT_EQ(choose_prefill_placement(no_prefill, policy), PrefillPlacement::kLocal);
  // The defaults send everything but a prompt cached in full to a prefill node.
  input.hit_blocks = 19;
  EXPECT_EQ(choose_prefill_placement(input, PlacementPolicy{}), PrefillPlacement::kRemote);
  EXPECT_EQ(prefill_placement_name(PrefillPlacement::kCached), "cached");
}

}  // namespace
}  // namespace pdserve::proxy
