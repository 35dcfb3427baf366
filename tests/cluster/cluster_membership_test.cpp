// ClusterMembership against fake proxies: a node registered with several proxies keeps its
// heartbeats to a live proxy on cadence while another proxy never answers; a drain at one proxy
// reaches the others through the heartbeats, and the node retires once every proxy let it go.
#include "common/cluster/cluster_membership.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/http/http_server.h"
#include "common/http/route_table.h"

namespace pdserve {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Call {
  Clock::time_point at;
  std::string body;
};

// A proxy whose answer to each heartbeat `answer` decides: an HTTP status and a state for 200,
// or no answer at all (status 0).
class FakeProxy {
 public:
  using Answer = std::function<std::pair<int, NodeState>(const Heartbeat&)>;

  explicit FakeProxy(std::string id, Answer answer) : id_(std::move(id)), answer_(std::move(answer)) {
    http::RouteTable router;
    router.add("POST", "/cluster/nodes",
               [this](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> channel) {
                 {
                   std::lock_guard lock(mutex_);
                   ++registrations_;
                 }
                 channel->send({200, "application/json", {}, RegistrationReply{id_}.to_json().dump()});
               });
    router.add_prefix(
        "POST", "/cluster/nodes/",
        [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
          const Heartbeat heartbeat = Heartbeat::parse(nlohmann::json::parse(request.body)).value();
          const auto [status, state] = answer_(heartbeat);
          std::lock_guard lock(mutex_);
          heartbeats_.push_back({Clock::now(), request.body});
          if (status == 0) {
            stalled_.push_back(ch);  // never answered
            return;
          }
          ch->send({status, "application/json", {},
                    status == 200 ? HeartbeatReply{id_, state}.to_json().dump()
                                  : std::string(R"({"error":{"message":"x"}})")});
        });
    router.add_prefix("DELETE", "/cluster/nodes/",
                      [](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> ch) {
                        ch->send({200, "application/json", {}, "{}"});
                      });
    server_ = http::HttpServer::start({}, std::move(router)).value();
  }
  ~FakeProxy() { server_->stop(); }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  std::vector<Call> heartbeats() {
    std::lock_guard lock(mutex_);
    return heartbeats_;
  }
  int registrations() {
    std::lock_guard lock(mutex_);
    return registrations_;
  }

 private:
  std::string id_;
  Answer answer_;
  std::mutex mutex_;
  int registrations_ = 0;
  std::vector<Call> heartbeats_;
  std::vector<std::shared_ptr<http::ResponseChannel>> stalled_;
  std::unique_ptr<http::HttpServer> server_;
};

MembershipOptions options_for(const std::vector<std::string>& proxies) {
  MembershipOptions options;
  options.proxy_urls = proxies;
  options.cluster_token = "secret";
  options.registration.role = NodeRole::kDecode;
  options.registration.url = "http://127.0.0.1:1";
  options.heartbeat_interval = 200ms;
  return options;
}

// Polled: an agent's retired() and the membership's callbacks are states without an event to
// wait on, and the heartbeat counts share the helper.
bool wait_for(const std::function<bool()>& condition, std::chrono::seconds limit = 10s) {
  const auto deadline = Clock::now() + limit;
  while (!condition()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

TEST(ClusterMembership, AProxyThatNeverAnswersDoesNotDelayTheHeartbeatsToTheOthers) {
  FakeProxy stalled("decode-1", [](const Heartbeat&) { return std::pair{0, NodeState::kUp}; });
  FakeProxy live("decode-7", [](const Heartbeat&) { return std::pair{200, NodeState::kUp}; });
  std::unique_ptr<ClusterMembership> membership =
      ClusterMembership::start(options_for({stalled.url(), live.url()}), [] { return NodeLoad{}; })
          .value();
  ASSERT_TRUE(wait_for([&] { return live.heartbeats().size() >= 6; }));
  const std::vector<Call> calls = live.heartbeats();
  for (size_t index = 1; index < calls.size(); ++index) {
    const double gap = std::chrono::duration<double>(calls[index].at - calls[index - 1].at).count();
    // On the 200 ms cadence; one loop over both proxies would wait out the stalled call first.
    EXPECT_LT(gap, 0.35) << "heartbeat " << index << " to the live proxy came " << gap << " s late";
  }
  EXPECT_EQ(membership->agent(1).node_id(), "decode-7");
  EXPECT_EQ(membership->agent(0).node_id(), "decode-1");  // registered, heartbeats unanswered
  const auto before = Clock::now();
  membership.reset();  // leaves both, side by side
  EXPECT_LT(Clock::now() - before, 3s);
}

TEST(ClusterMembership, ADrainAtOneProxyDrainsTheNodeAtEveryProxyAndRetiresItOnce) {
  std::mutex mutex;
  bool drain_a = false;
  bool a_retires = false;
  FakeProxy a("decode-1", [&](const Heartbeat&) {
    std::lock_guard lock(mutex);
    if (a_retires) return std::pair{410, NodeState::kUp};
    return std::pair{200, drain_a ? NodeState::kDraining : NodeState::kUp};
  });
  // B drains the node when a heartbeat says so, then retires it a few heartbeats later.
  int b_draining_heartbeats = 0;
  FakeProxy b("decode-2", [&](const Heartbeat& heartbeat) {
    std::lock_guard lock(mutex);
    if (heartbeat.draining && ++b_draining_heartbeats > 2) return std::pair{410, NodeState::kUp};
    return std::pair{200, heartbeat.draining ? NodeState::kDraining : NodeState::kUp};
  });
  // C forgets the node (it restarted): a draining node does not register there again.
  FakeProxy c("decode-3", [&](const Heartbeat& heartbeat) {
    return std::pair{heartbeat.draining ? 404 : 200, NodeState::kUp};
  });
  std::atomic<int> retired{0};
  MembershipOptions options = options_for({a.url(), b.url(), c.url()});
  options.on_retired = [&] { ++retired; };
  std::unique_ptr<ClusterMembership> membership =
      ClusterMembership::start(options, [] { return NodeLoad{}; }).value();
  ASSERT_TRUE(wait_for([&] { return b.heartbeats().size() >= 2 && c.heartbeats().size() >= 2; }));
  EXPECT_FALSE(membership->draining());
  {
    std::lock_guard lock(mutex);
    drain_a = true;  // POST /cluster/nodes/ID/drain at A
  }
  ASSERT_TRUE(wait_for([&] { return membership->agent(1).retired(); }))
      << "B never retired the node: its heartbeats did not say draining";
  EXPECT_TRUE(membership->draining());
  ASSERT_TRUE(wait_for([&] { return membership->agent(2).retired(); }));
  EXPECT_EQ(membership->agent(2).state(), AgentState::kLeft);
  EXPECT_EQ(c.registrations(), 1);
  EXPECT_EQ(retired.load(), 0);  // A still has the node's requests
  EXPECT_FALSE(membership->retired());
  {
    std::lock_guard lock(mutex);
    a_retires = true;
  }
  ASSERT_TRUE(wait_for([&] { return retired.load() == 1; }));
  EXPECT_TRUE(membership->retired());
  EXPECT_EQ(membership->agent(0).state(), AgentState::kRetired);
}

TEST(ClusterMembership, NoProxyOrTheSameProxyTwiceIsRefused) {
  EXPECT_EQ(ClusterMembership::start(options_for({}), {}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ClusterMembership::start(options_for({"http://127.0.0.1:9", "http://127.0.0.1:9/"}), {})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve
