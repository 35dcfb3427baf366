// Cache-aware placement with KV tiers (issue #32): the keys a node reports in its lower tiers
// (Heartbeat::tiered_cache) are a second index per node; a prompt block held there scores
// between a pool hit and a miss, by --route-tier-hit-weight. The index is bounded as the pool's
// and leaves with the node.
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "proxy/routing/node_registry.h"
#include "registry_test_util.h"

namespace pdserve::proxy {
namespace {

using Json = nlohmann::json;
using Clock = NodeRegistry::Clock;
using std::chrono::milliseconds;

constexpr int kBlockSize = 4;

using testing::must_register;
using testing::test_options;

// An idle node's heartbeat reporting `pool` keys in its pool and `tiers` keys in its tiers.
Json heartbeat(const std::vector<uint64_t>& pool, const std::vector<uint64_t>& tiers,
               bool tiers_reset = false) {
  Json body = {{"load", {{"kv_blocks_total", 100}}}};
  body["prefix_cache"] = PrefixCacheReport{kBlockSize, false, pool, {}}.to_json();
  body["tiered_cache"] = PrefixCacheReport{kBlockSize, tiers_reset, tiers, {}}.to_json();
  return body;
}

// 10 reusable blocks of 4 tokens.
std::vector<int32_t> prompt() {
  std::vector<int32_t> tokens(41);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i + 11);
  return tokens;
}

std::vector<uint64_t> first(const std::vector<uint64_t>& chain, size_t count) {
  return {chain.begin(), chain.begin() + static_cast<std::ptrdiff_t>(count)};
}

std::vector<std::string> ids(const std::vector<NodeRef>& refs) {
  std::vector<std::string> out;
  for (const NodeRef& ref : refs) out.push_back(ref.id);
  return out;
}

TEST(TieredRouting, MatchCountsPoolBlocksInFullTierBlocksAtTheirWeightAndStopsAtAMiss) {
  PrefixKeySet pool(100);
  PrefixKeySet tiers(100);
  pool.apply({kBlockSize, false, {1, 2, 5}, {}});
  tiers.apply({kBlockSize, false, {2, 3, 4, 7}, {}});
  const std::vector<uint64_t> chain = {1, 2, 3, 4, 5, 6, 7};
  const PrefixMatch match = match_prefix(chain, pool, tiers);
  EXPECT_EQ(match.pool_blocks, 3u);  // 1, 2 (in both: the pool's), 5
  EXPECT_EQ(match.tier_blocks, 2u);  // 3, 4; 6 is held nowhere, so 7 does not count
  RoutingWeights weights;
  weights.tier_hit = 0.25;
  EXPECT_DOUBLE_EQ(prefix_hit(match, chain.size(), weights), (3 + 0.25 * 2) / 7.0);
  EXPECT_DOUBLE_EQ(prefix_hit(match, 0, weights), 0.0);
  EXPECT_EQ(RoutingWeights{}.tier_hit, 0.5);  // the documented default
}

TEST(TieredRouting, ATierHitBeatsAMissAndLosesToAPoolHitOfEqualLength) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  const std::string pooled = must_register(registry, "decode", 9000, now);
  const std::string tiered = must_register(registry, "decode", 9001, now);
  const std::string missing = must_register(registry, "decode", 9002, now);
  const std::vector<int32_t> tokens = prompt();
  const std::vector<uint64_t> chain = reusable_block_chain(tokens, kBlockSize);
  ASSERT_TRUE(registry.heartbeat(pooled, heartbeat(chain, {}), now).ok());
  ASSERT_TRUE(registry.heartbeat(tiered, heartbeat({}, chain), now).ok());
  ASSERT_TRUE(registry.heartbeat(missing, heartbeat({}, {}), now).ok());
  const RoutingQuery query{tokens, 41};

  const std::optional<NodeRef> best = registry.pick_decode({}, now, query);
  ASSERT_TRUE(best);
  EXPECT_EQ(best->id, pooled);
  EXPECT_EQ(best->hit_blocks, 10u);
  EXPECT_EQ(best->tier_hit_blocks, 0u);
  const std::optional<NodeRef> second = registry.pick_decode({pooled}, now, query);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->id, tiered);
  EXPECT_EQ(second->hit_blocks, 0u);
  EXPECT_EQ(second->tier_hit_blocks, 10u);
  EXPECT_EQ(registry.pick_decode({pooled, tiered}, now, query)->id, missing);

  // The weight is what a tier hit is worth in load: a full tier hit (0.5) outweighs four more
  // sequences (0.4) there, not six (0.6).
  for (int i = 0; i < 4; ++i) registry.begin_request(tiered, "", 0);
  EXPECT_EQ(registry.pick_decode({pooled}, now, query)->id, tiered);
  for (int i = 0; i < 2; ++i) registry.begin_request(tiered, "", 0);
  EXPECT_EQ(registry.pick_decode({pooled}, now, query)->id, missing);
}

TEST(TieredRouting, APoolPrefixContinuedInTheTiersBeatsThePoolPrefixAlone) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  const std::string pool_only = must_register(registry, "decode", 9000, now);
  const std::string continued = must_register(registry, "decode", 9001, now);
  const std::vector<int32_t> tokens = prompt();
  const std::vector<uint64_t> chain = reusable_block_chain(tokens, kBlockSize);
  ASSERT_TRUE(registry.heartbeat(pool_only, heartbeat(first(chain, 4), {}), now).ok());
  const std::vector<uint64_t> rest(chain.begin() + 4, chain.end());
  ASSERT_TRUE(registry.heartbeat(continued, heartbeat(first(chain, 4), rest), now).ok());
  const std::optional<NodeRef> picked = registry.pick_decode({}, now, {tokens, 41});
  ASSERT_TRUE(picked);
  EXPECT_EQ(picked->id, continued);
  EXPECT_EQ(picked->hit_blocks, 4u);
  EXPECT_EQ(picked->tier_hit_blocks, 6u);
}

TEST(TieredRouting, PrefillNodesRankPoolHitThenTierHitThenMiss) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  const std::string missing = must_register(registry, "prefill", 9000, now);
  const std::string tiered = must_register(registry, "prefill", 9001, now);
  const std::string pooled = must_register(registry, "prefill", 9002, now);
  const std::vector<int32_t> tokens = prompt();
  const std::vector<uint64_t> chain = reusable_block_chain(tokens, kBlockSize);
  ASSERT_TRUE(registry.heartbeat(missing, heartbeat({}, {}), now).ok());
  ASSERT_TRUE(registry.heartbeat(tiered, heartbeat({}, chain), now).ok());
  ASSERT_TRUE(registry.heartbeat(pooled, heartbeat(chain, {}), now).ok());
  const std::vector<NodeRef> ranked = registry.rank_prefill(now, {tokens, 41});
  EXPECT_EQ(ids(ranked), (std::vector<std::string>{pooled, tiered, missing}));
  EXPECT_EQ(ranked[1].tier_hit_blocks, 10u);
}

TEST(TieredRouting, ZeroTierWeightMakesATierHitWorthNothing) {
  RegistryOptions options = test_options();
  options.weights.tier_hit = 0.0;
  NodeRegistry registry(options);
  const auto now = Clock::now();
  const std::string missing = must_register(registry, "decode", 9000, now);
  const std::string tiered = must_register(registry, "decode", 9001, now);
  const std::vector<int32_t> tokens = prompt();
  ASSERT_TRUE(registry.heartbeat(missing, heartbeat({}, {}), now).ok());
  ASSERT_TRUE(
      registry.heartbeat(tiered, heartbeat({}, reusable_block_chain(tokens, kBlockSize)), now)
          .ok());
  registry.begin_request(tiered, "", 0);  // one sequence more there: load decides
  EXPECT_EQ(registry.pick_decode({}, now, {tokens, 41})->id, missing);
}

TEST(TieredRouting, TierKeysAreBoundedPerNodeAndLeaveWithTheNode) {
  RegistryOptions options = test_options();
  options.prefix_keys_per_node = 5;
  NodeRegistry registry(options);
  const auto now = Clock::now();
  const std::string a = must_register(registry, "decode", 9000, now);
  const std::string b = must_register(registry, "prefill", 9001, now);
  ASSERT_TRUE(registry.heartbeat(a, heartbeat({1, 2}, {11, 12, 13, 14, 15, 16, 17}), now).ok());
  ASSERT_TRUE(registry.heartbeat(b, heartbeat({}, {21, 22, 23}), now).ok());
  EXPECT_EQ(registry.tiered_keys(), 8u);  // a's 7 cut to the bound, the least recent dropped
  EXPECT_EQ(registry.prefix_keys(), 2u);  // the pool's index is apart
  const Json cluster = registry.to_json(now);
  const Json cluster_a = [&] {
    for (const Json& node : cluster["nodes"]) {
      if (node["id"] == a) return node;
    }
    return Json();
  }();
  EXPECT_EQ(cluster_a["tiered_cache"], (Json{{"block_size", kBlockSize}, {"keys", 5}}));
  // A reset report replaces the node's tier keys, not its pool keys.
  ASSERT_TRUE(registry.heartbeat(a, heartbeat({}, {31}, /*tiers_reset=*/true), now).ok());
  EXPECT_EQ(registry.tiered_keys(), 4u);
  EXPECT_EQ(registry.prefix_keys(), 2u);
  ASSERT_TRUE(registry.remove(b).ok());
  EXPECT_EQ(registry.tiered_keys(), 1u);
  registry.expire(now + milliseconds(1'001));  // a falls silent
  EXPECT_EQ(registry.tiered_keys(), 0u);
}

TEST(TieredRouting, ABadTierReportIsRefusedAndChangesNothing) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  const std::string node = must_register(registry, "decode", 9000, now);
  ASSERT_TRUE(registry.heartbeat(node, heartbeat({1}, {2, 3}), now).ok());
  Json bad = heartbeat({4}, {5});
  bad["tiered_cache"]["stored"].push_back("not-a-key");
  const Result<NodeState> refused = registry.heartbeat(node, bad, now);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("tiered_cache"), std::string::npos);
  EXPECT_EQ(registry.tiered_keys(), 2u);
  EXPECT_EQ(registry.prefix_keys(), 1u);  // the pool report of the same heartbeat is not applied
}

}  // namespace
}  // namespace pdserve::proxy
