// A node's KV-tier keys from its tier store to the proxy's placement, over HTTP (issue #32):
// a fake tier store (the real one is kv_tiers/) feeds each node's real cluster membership
// (tiered_cache_feed, PrefixCacheFanout, NodeAgent); a real ProxyServer applies their heartbeats;
// its registry then places a prompt on the node whose tiers hold it, sees a key leave, and drops
// the node's tier index when the node leaves.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/cluster/cluster_membership.h"
#include "common/http/http_client.h"
#include "common/http/http_server.h"
#include "proxy/proxy_server.h"
#include "serving/prefix_cache_fanout.h"
#include "serving/prefix_cache_feeds.h"
#include "tests/serving/fake_tiered_key_source.h"

namespace pdserve {
namespace {

using namespace std::chrono_literals;
using testing::FakeTieredKeySource;

constexpr char kToken[] = "cluster-secret";
constexpr int kBlockSize = 4;

// One node as serve_until_shutdown joins it, with a fake tier store and no pool report.
class TieredNode {
 public:
  TieredNode(const std::string& proxy_url, int port)
      : fanout_(tiered_cache_feed(&source_, kBlockSize), kBlockSize, 1) {
    MembershipOptions options;
    options.proxy_urls = {proxy_url};
    options.cluster_token = kToken;
    options.registration.role = NodeRole::kDecode;
    options.registration.url = "http://127.0.0.1:" + std::to_string(port);
    options.registration.model = "m";
    options.registration.kv_blocks_total = 100;
    options.heartbeat_interval = 100ms;
    options.tiered_cache = [this](size_t index) { return fanout_.feed(index); };
    membership_ = ClusterMembership::start(std::move(options), [] {
                    return NodeLoad{0, 0, 100, 0};
                  }).value();
  }

  FakeTieredKeySource& tiers() { return source_; }
  std::string id() const { return membership_->agent(0).node_id(); }
  void leave() { membership_.reset(); }  // DELETE /cluster/nodes/ID, answered before it returns

 private:
  FakeTieredKeySource source_;
  PrefixCacheFanout fanout_;
  std::unique_ptr<ClusterMembership> membership_;
};

class TieredRoutingE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    client_ = std::move(http::HttpClient::create(1).value());
    proxy::ProxyOptions options;
    options.access.cluster_token = kToken;
    proxy_ = std::make_unique<proxy::ProxyServer>(registry_, *client_, options);
    http::RouteTable router;
    proxy_->register_routes(router);
    server_ = std::move(http::HttpServer::start({}, std::move(router)).value());
  }
  void TearDown() override {
    server_->stop();
    client_.reset();
  }

  std::string proxy_url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }

  // Waits, heartbeat by heartbeat of `node`, until the proxy holds `keys` tier keys for all
  // nodes: a take follows the answer to the heartbeat before it, so each wake-up sees one more
  // applied. False after 10 s.
  bool wait_for_tier_keys(TieredNode& node, size_t keys) {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (registry_.tiered_keys() != keys) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left <= 0ms || !node.tiers().wait_for_take_after(node.tiers().takes(), left)) {
        return false;
      }
    }
    return true;
  }

  proxy::NodeRegistry registry_{proxy::RegistryOptions{}};
  std::unique_ptr<http::HttpClient> client_;
  std::unique_ptr<proxy::ProxyServer> proxy_;
  std::unique_ptr<http::HttpServer> server_;
};

TEST_F(TieredRoutingE2eTest, TheNodeWhoseTiersHoldThePromptIsPlacedAndItsIndexLeavesWithIt) {
  std::vector<int32_t> prompt(41);  // 10 reusable blocks of 4
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(3 * i + 1);
  const std::vector<uint64_t> chain = proxy::reusable_block_chain(prompt, kBlockSize);
  TieredNode holder(proxy_url(), 19001);
  TieredNode other(proxy_url(), 19002);
  for (const uint64_t key : chain) holder.tiers().offload(key);
  other.tiers().offload(12345);
  ASSERT_TRUE(wait_for_tier_keys(holder, chain.size() + 1))
      << "the proxy holds " << registry_.tiered_keys() << " tier keys";

  const auto now = proxy::NodeRegistry::Clock::now();
  const proxy::RoutingQuery query{prompt, static_cast<int64_t>(prompt.size())};
  const std::optional<proxy::NodeRef> picked = registry_.pick_decode({}, now, query);
  ASSERT_TRUE(picked);
  EXPECT_EQ(picked->id, holder.id());
  EXPECT_EQ(picked->tier_hit_blocks, chain.size());
  EXPECT_EQ(picked->hit_blocks, 0u);
  EXPECT_EQ(picked->block_size, kBlockSize);

  // A block leaving the tiers cuts the match there.
  holder.tiers().drop(chain[5]);
  ASSERT_TRUE(wait_for_tier_keys(holder, chain.size()));
  EXPECT_EQ(registry_.pick_decode({}, now, query)->tier_hit_blocks, 5u);

  holder.leave();
  EXPECT_EQ(registry_.tiered_keys(), 1u);  // only the other node's
  EXPECT_EQ(registry_.pick_decode({}, now, query)->id, other.id());
}

}  // namespace
}  // namespace pdserve
