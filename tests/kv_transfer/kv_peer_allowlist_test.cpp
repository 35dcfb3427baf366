// KvPeerAllowlist (issue #34): a prefill node sends KV only to the UCX workers of decode nodes
// registered at its proxies, learnt from GET /cluster/kv-peers of each (stand-in proxies here,
// real HTTP servers holding a list), refreshed once before an unknown address is refused.
#include "kv_transfer/kv_peer_allowlist.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/cluster/cluster_auth.h"
#include "common/cluster/cluster_messages.h"
#include "common/http/http_server.h"
#include "kv_transfer/descriptor.h"

namespace pdserve::kv_transfer {
namespace {

constexpr char kToken[] = "allowlist-test-token";
// Longer than any refresh here can take (refresh_timeout 2 s, twice), so a hang fails the test.
constexpr auto kAnswerDeadline = std::chrono::seconds(10);

std::string descriptor(const std::string& worker, std::uint64_t pool_base = 4096) {
  PeerDescriptor peer;
  peer.worker_address.assign(worker.begin(), worker.end());
  peer.packed_rkey = {1, 2, 3};
  peer.pool_base = pool_base;
  peer.pool_bytes = 1 << 20;
  return base64_encode(serialize_descriptor(peer));
}

// A proxy's GET /cluster/kv-peers over a list the test changes; it counts the calls.
class StandInProxy {
 public:
  StandInProxy() {
    http::RouteTable router;
    router.add("GET", "/cluster/kv-peers",
               [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
                 std::lock_guard lock(mutex_);
                 ++calls_;
                 if (!cluster_token_matches(request, kToken)) {
                   ch->send({401, "application/json", {}, R"({"error":{"message":"token"}})"});
                   return;
                 }
                 ch->send({200, "application/json", {}, list_.to_json().dump()});
               });
    auto server = http::HttpServer::start({}, std::move(router));
    EXPECT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(*server);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  void register_decode(const std::string& kv_descriptor) {
    std::lock_guard lock(mutex_);
    list_.kv_descriptors.push_back(kv_descriptor);
  }
  int calls() {
    std::lock_guard lock(mutex_);
    return calls_;
  }
  void stop() { server_->stop(); }

 private:
  std::mutex mutex_;
  KvPeerList list_;
  int calls_ = 0;
  std::unique_ptr<http::HttpServer> server_;
};

std::unique_ptr<KvPeerAllowlist> allowlist(std::vector<std::string> proxies,
                                           std::string token = kToken) {
  Result<std::unique_ptr<KvPeerAllowlist>> created =
      KvPeerAllowlist::create({std::move(proxies), std::move(token), std::chrono::seconds(2)});
  EXPECT_TRUE(created.ok()) << created.status().to_string();
  return created.ok() ? std::move(*created) : nullptr;
}

// check()'s answer, waited for.
Status verdict(KvPeerAllowlist& peers, const std::string& kv_descriptor) {
  auto answer = std::make_shared<std::promise<Status>>();
  std::future<Status> future = answer->get_future();
  peers.check(kv_descriptor, [answer](const Status& status) { answer->set_value(status); });
  if (future.wait_for(kAnswerDeadline) != std::future_status::ready) {
    return deadline_exceeded("check() did not answer");
  }
  return future.get();
}

TEST(KvPeerAllowlist, AdmitsARegisteredDecodeNodesWorkerWhateverPoolTheDescriptorClaims) {
  StandInProxy proxy;
  proxy.register_decode(descriptor("decode-worker-1"));
  auto peers = allowlist({proxy.url()});
  EXPECT_TRUE(verdict(*peers, descriptor("decode-worker-1")).ok());
  // The pool claim is the handshake's to check (peer_handshake.h); the worker is what UCX unpacks.
  EXPECT_TRUE(verdict(*peers, descriptor("decode-worker-1", 1 << 30)).ok());
  EXPECT_TRUE(peers->contains(std::vector<std::uint8_t>{'d', 'e', 'c', 'o', 'd', 'e', '-', 'w', 'o',
                                                        'r', 'k', 'e', 'r', '-', '1'}));
}

TEST(KvPeerAllowlist, RefusesAnUnknownWorkerOnlyAfterRefreshingFromEveryProxy) {
  StandInProxy proxy;
  proxy.register_decode(descriptor("decode-worker-1"));
  auto peers = allowlist({proxy.url()});
  ASSERT_TRUE(verdict(*peers, descriptor("decode-worker-1")).ok());
  const int calls = proxy.calls();
  const Status refused = verdict(*peers, descriptor("forged \x01\x02 worker"));
  EXPECT_EQ(refused.code(), StatusCode::kPermissionDenied) << refused.to_string();
  EXPECT_NE(refused.message().find("not that of a decode node registered"), std::string::npos)
      << refused.message();
  EXPECT_EQ(proxy.calls(), calls + 1) << "one refresh before the refusal";
  // A worker address that is a registered one plus a byte is another address.
  EXPECT_EQ(verdict(*peers, descriptor("decode-worker-1x")).code(), StatusCode::kPermissionDenied);
}

TEST(KvPeerAllowlist, ADecodeNodeThatRegisteredAMomentAgoAtAnyProxyIsFound) {
  StandInProxy first;
  StandInProxy second;
  first.register_decode(descriptor("decode-at-first"));
  auto peers = allowlist({first.url(), second.url()});
  ASSERT_TRUE(verdict(*peers, descriptor("decode-at-first")).ok());
  // Registered at the second proxy only, after the allowlist read both: the union after a
  // refresh has it.
  second.register_decode(descriptor("decode-at-second"));
  EXPECT_TRUE(verdict(*peers, descriptor("decode-at-second")).ok());
  EXPECT_TRUE(verdict(*peers, descriptor("decode-at-first")).ok());
}

TEST(KvPeerAllowlist, ChecksArrivingDuringARefreshWaitForTheNextOne) {
  StandInProxy proxy;
  auto peers = allowlist({proxy.url()});
  // Several unknown workers at once, one of which registers between them: every check is
  // answered, each after a refresh that started after it.
  std::vector<std::future<Status>> answers;
  for (int i = 0; i < 8; ++i) {
    if (i == 4) proxy.register_decode(descriptor("late-decode"));
    auto answer = std::make_shared<std::promise<Status>>();
    answers.push_back(answer->get_future());
    peers->check(descriptor(i % 2 == 0 ? "late-decode" : "never-registered"),
                 [answer](const Status& status) { answer->set_value(status); });
  }
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(answers[i].wait_for(kAnswerDeadline), std::future_status::ready) << i;
    const Status status = answers[i].get();
    if (i % 2 == 0 && i >= 4) {
      EXPECT_TRUE(status.ok()) << i << ": " << status.to_string();
    }
    if (i % 2 == 1) {
      EXPECT_EQ(status.code(), StatusCode::kPermissionDenied) << i;
    }
  }
}

TEST(KvPeerAllowlist, AnUnreadableDescriptorIsRefusedAtOnceWithoutARefresh) {
  StandInProxy proxy;
  auto peers = allowlist({proxy.url()});
  ASSERT_EQ(verdict(*peers, descriptor("x")).code(), StatusCode::kPermissionDenied);
  const int calls = proxy.calls();
  for (const std::string& text : {std::string("not base64!"), base64_encode("PDKX\x01"),
                                  base64_encode("PDKV\x01short"), std::string()}) {
    EXPECT_EQ(verdict(*peers, text).code(), StatusCode::kInvalidArgument) << text;
  }
  EXPECT_EQ(proxy.calls(), calls);
}

TEST(KvPeerAllowlist, ProxiesThatDoNotAnswerMakeItUnavailableWithinTheDeadline) {
  StandInProxy down;
  const std::string url = down.url();
  down.stop();
  StandInProxy wrong_token;
  wrong_token.register_decode(descriptor("decode"));
  auto peers = allowlist({url, wrong_token.url()}, "not-the-token");
  const auto start = std::chrono::steady_clock::now();
  const Status status = verdict(*peers, descriptor("decode"));
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status.to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(KvPeerAllowlist, OneProxyDownStillLeavesTheOthersDecodeNodes) {
  StandInProxy down;
  const std::string url = down.url();
  down.stop();
  StandInProxy up;
  up.register_decode(descriptor("decode"));
  auto peers = allowlist({url, up.url()});
  EXPECT_TRUE(verdict(*peers, descriptor("decode")).ok());
  EXPECT_EQ(verdict(*peers, descriptor("other")).code(), StatusCode::kPermissionDenied);
}

TEST(KvPeerAllowlist, WithoutAProxyEveryWorkerIsRefused) {
  auto peers = allowlist({});
  const Status status = verdict(*peers, descriptor("decode"));
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(status.message().find("--proxy"), std::string::npos) << status.message();
}

TEST(KvPeerAllowlist, ABadProxyUrlIsRefusedAtCreation) {
  EXPECT_EQ(KvPeerAllowlist::create({{"ftp://x"}, kToken}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(KvPeerAllowlist, AChecksWaitEndsWhenTheAllowlistStops) {
  // A proxy that accepts and never answers: the check waits for the refresh, which the
  // destructor cancels.
  http::RouteTable router;
  std::mutex held_mutex;
  std::vector<std::shared_ptr<http::ResponseChannel>> held;
  router.add("GET", "/cluster/kv-peers",
             [&](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> ch) {
               std::lock_guard lock(held_mutex);
               held.push_back(std::move(ch));
             });
  auto server = http::HttpServer::start({}, std::move(router));
  ASSERT_TRUE(server.ok());
  auto peers = allowlist({"http://127.0.0.1:" + std::to_string((*server)->port())});
  auto answer = std::make_shared<std::promise<Status>>();
  std::future<Status> future = answer->get_future();
  peers->check(descriptor("decode"), [answer](const Status& status) { answer->set_value(status); });
  peers.reset();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_FALSE(future.get().ok());
  (*server)->stop();
}

}  // namespace
}  // namespace pdserve::kv_transfer
