// NodeAgent against a fake proxy: a heartbeat that gets no answer (a lost packet, a stalled
// proxy) does not hold up the next one, so a healthy node is not dropped for one lost call; the
// prefix-cache changes it carried are given back to be sent again.
#include "common/cluster/node_agent.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/http/http_server.h"
#include "common/http/route_table.h"

namespace pdserve {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class FakeProxy {
 public:
  FakeProxy() {
    http::RouteTable router;
    router.add("POST", "/cluster/nodes",
               [](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> channel) {
                 channel->send(
                     {200, "application/json", {}, RegistrationReply{"decode-1"}.to_json().dump()});
               });
    router.add_prefix("POST", "/cluster/nodes/",
                      [this](const http::HttpRequest& request,
                             std::shared_ptr<http::ResponseChannel> ch) {
                        std::lock_guard lock(mutex_);
                        arrivals_.push_back(Clock::now());
                        bodies_.push_back(request.body);
                        heartbeat_arrived_.notify_all();
                        if (arrivals_.size() == 1) {
                          stalled_ = ch;  // the first heartbeat is never answered
                          return;
                        }
                        ch->send({200,
                                  "application/json",
                                  {},
                                  HeartbeatReply{"decode-1", NodeState::kUp}.to_json().dump()});
                      });
    router.add_prefix("DELETE", "/cluster/nodes/",
                      [](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> ch) {
                        ch->send({200, "application/json", {}, "{}"});
                      });
    server_ = http::HttpServer::start({}, std::move(router)).value();
  }
  ~FakeProxy() { server_->stop(); }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  std::vector<Clock::time_point> arrivals() {
    std::lock_guard lock(mutex_);
    return arrivals_;
  }
  std::vector<std::string> bodies() {
    std::lock_guard lock(mutex_);
    return bodies_;
  }
  // Waits (up to 10 s) until `count` heartbeats have arrived.
  bool wait_for_heartbeats(size_t count) {
    std::unique_lock lock(mutex_);
    return heartbeat_arrived_.wait_for(lock, 10s, [&] { return arrivals_.size() >= count; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable heartbeat_arrived_;
  std::vector<Clock::time_point> arrivals_;
  std::vector<std::string> bodies_;
  std::shared_ptr<http::ResponseChannel> stalled_;
  std::unique_ptr<http::HttpServer> server_;
};

TEST(NodeAgent, AnUnansweredHeartbeatDoesNotHoldUpTheNext) {
  FakeProxy proxy;
  NodeAgentOptions options;
  options.proxy_url = proxy.url();
  options.cluster_token = "secret";
  options.registration.role = NodeRole::kDecode;
  options.registration.url = "http://127.0.0.1:1";
  options.heartbeat_interval = 500ms;
  std::unique_ptr<NodeAgent> agent = NodeAgent::start(options, [] { return NodeLoad{}; }).value();
  proxy.wait_for_heartbeats(4);
  const std::vector<Clock::time_point> arrivals = proxy.arrivals();
  ASSERT_GE(arrivals.size(), 4u);
  // The stalled call ends at its bound (the interval), and the next starts on the cadence:
  // about one interval later, far below the proxy's 3 s expiry (it was 2 s + an interval).
  const double gap = std::chrono::duration<double>(arrivals[1] - arrivals[0]).count();
  EXPECT_LT(gap, 1.2) << "the heartbeat after an unanswered one came " << gap << " s later";
  EXPECT_EQ(agent->node_id(), "decode-1");
}

// A key journal stand-in: every take reports one new key (1, 2, ...); what is given back and
// the snapshots asked for are recorded.
struct OneKeyPerTakeFeed {
  std::mutex mutex;
  uint64_t next_key = 1;
  int resyncs = 0;
  std::vector<uint64_t> restored;

  PrefixCacheFeed feed() {
    PrefixCacheFeed feed;
    feed.take = [this]() -> std::optional<PrefixCacheReport> {
      std::lock_guard lock(mutex);
      return PrefixCacheReport{16, false, {next_key++}, {}};
    };
    feed.restore = [this](PrefixCacheReport report) {
      std::lock_guard lock(mutex);
      restored.insert(restored.end(), report.stored.begin(), report.stored.end());
    };
    feed.resync = [this] {
      std::lock_guard lock(mutex);
      ++resyncs;
    };
    return feed;
  }
};

TEST(NodeAgent, PrefixChangesOfAnUnansweredHeartbeatAreGivenBackAndRegistrationAsksForASnapshot) {
  FakeProxy proxy;
  OneKeyPerTakeFeed pool;
  NodeAgentOptions options;
  options.proxy_url = proxy.url();
  options.registration.role = NodeRole::kPrefill;
  options.registration.url = "http://127.0.0.1:1";
  options.heartbeat_interval = 200ms;
  options.prefix_cache = pool.feed();
  std::unique_ptr<NodeAgent> agent = NodeAgent::start(options, [] { return NodeLoad{}; }).value();
  proxy.wait_for_heartbeats(3);
  agent.reset();
  const std::vector<std::string> bodies = proxy.bodies();
  ASSERT_GE(bodies.size(), 3u);
  for (size_t index = 0; index < bodies.size(); ++index) {
    const Heartbeat heartbeat = Heartbeat::parse(nlohmann::json::parse(bodies[index])).value();
    ASSERT_TRUE(heartbeat.prefix_cache.has_value()) << bodies[index];
    EXPECT_EQ(heartbeat.prefix_cache->stored, std::vector<uint64_t>{index + 1});
  }
  std::lock_guard lock(pool.mutex);
  EXPECT_EQ(pool.resyncs, 1);  // after the one registration
  EXPECT_EQ(pool.restored, std::vector<uint64_t>{1});  // only the unanswered first heartbeat's
}

TEST(NodeAgent, TieredChangesTravelBesideThePoolsByTheSameRules) {
  FakeProxy proxy;
  std::mutex mutex;
  int pool_resyncs = 0;
  OneKeyPerTakeFeed tiers;
  NodeAgentOptions options;
  options.proxy_url = proxy.url();
  options.registration.role = NodeRole::kDecode;
  options.registration.url = "http://127.0.0.1:1";
  options.heartbeat_interval = 200ms;
  PrefixCacheFeed pool;
  pool.take = []() -> std::optional<PrefixCacheReport> { return std::nullopt; };
  pool.restore = [](PrefixCacheReport) { ADD_FAILURE() << "no pool report was sent"; };
  pool.resync = [&] {
    std::lock_guard lock(mutex);
    ++pool_resyncs;
  };
  options.prefix_cache = pool;
  options.tiered_cache = tiers.feed();
  std::unique_ptr<NodeAgent> agent = NodeAgent::start(options, [] { return NodeLoad{}; }).value();
  proxy.wait_for_heartbeats(3);
  agent.reset();
  const std::vector<std::string> bodies = proxy.bodies();
  ASSERT_GE(bodies.size(), 3u);
  for (size_t index = 0; index < bodies.size(); ++index) {
    const Heartbeat heartbeat = Heartbeat::parse(nlohmann::json::parse(bodies[index])).value();
    EXPECT_FALSE(heartbeat.prefix_cache.has_value()) << bodies[index];
    ASSERT_TRUE(heartbeat.tiered_cache.has_value()) << bodies[index];
    EXPECT_EQ(heartbeat.tiered_cache->stored, std::vector<uint64_t>{index + 1});
  }
  std::lock_guard lock(mutex);
  std::lock_guard tiers_lock(tiers.mutex);
  EXPECT_EQ(pool_resyncs, 1);  // both after the one registration
  EXPECT_EQ(tiers.resyncs, 1);
  EXPECT_EQ(tiers.restored, std::vector<uint64_t>{1});  // only the unanswered first heartbeat's
}

}  // namespace
}  // namespace pdserve
