// NodeAgent against a fake proxy: a heartbeat that gets no answer (a lost packet, a stalled
// proxy) does not hold up the next one, so a healthy node is not dropped for one lost call.
#include "common/cluster/node_agent.h"

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/http/http_server.h"
#include "common/http/router.h"

namespace pdserve {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class FakeProxy {
 public:
  FakeProxy() {
    http::Router router;
    router.add("POST", "/cluster/nodes",
               [](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> channel) {
                 channel->send(
                     {200, "application/json", {}, RegistrationReply{"decode-1"}.to_json().dump()});
               });
    router.add_prefix("POST", "/cluster/nodes/",
                      [this](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> ch) {
                        std::lock_guard lock(mutex_);
                        arrivals_.push_back(Clock::now());
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

 private:
  std::mutex mutex_;
  std::vector<Clock::time_point> arrivals_;
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
  const auto deadline = Clock::now() + 10s;
  while (proxy.arrivals().size() < 4 && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
  const std::vector<Clock::time_point> arrivals = proxy.arrivals();
  ASSERT_GE(arrivals.size(), 4u);
  // The stalled call ends at its bound (the interval), and the next starts on the cadence:
  // about one interval later, far below the proxy's 3 s expiry (it was 2 s + an interval).
  const double gap = std::chrono::duration<double>(arrivals[1] - arrivals[0]).count();
  EXPECT_LT(gap, 1.2) << "the heartbeat after an unanswered one came " << gap << " s later";
  EXPECT_EQ(agent->node_id(), "decode-1");
}

}  // namespace
}  // namespace pdserve
