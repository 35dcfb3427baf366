// The UCX workers a prefill node may send KV to (issue #34): those of the decode nodes
// registered at its proxies. A work request's descriptor is a claim by whoever holds the cluster
// token, and UCX aborts the process on a worker address it cannot unpack (ucp_address_unpack,
// ucp_ep_create), so no address from a request reaches UCX unless it is, byte for byte, the
// worker address of a decode node that registered its descriptor at one of the node's proxies
// (GET /cluster/kv-peers, the union over every proxy). An address not in the set makes the set
// refresh once from every proxy (each fetch bounded by refresh_timeout), so a decode node that
// registered a moment ago is found; after that it is refused. UCX's address format is private:
// nothing here reads inside an address, it is only compared.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/core/status.h"
#include "common/http/http_client.h"

namespace pdserve::kv_transfer {

struct KvPeerAllowlistOptions {
  std::vector<std::string> proxy_urls;  // http://HOST:PORT each; none: every address is refused
  std::string cluster_token;
  // One refresh's fetch from each proxy (side by side): a refused or delayed work waits at
  // most about twice this (a refresh already under way, then its own).
  std::chrono::milliseconds refresh_timeout{1'000};
};

class KvPeerAllowlist {
 public:
  // Starts the first refresh at once. InvalidArgument for a bad proxy URL.
  static Result<std::unique_ptr<KvPeerAllowlist>> create(KvPeerAllowlistOptions options);
  // Cancels the fetches in flight; waiting checks are answered Unavailable first.
  ~KvPeerAllowlist();
  KvPeerAllowlist(const KvPeerAllowlist&) = delete;
  KvPeerAllowlist& operator=(const KvPeerAllowlist&) = delete;

  // Calls `done` once: OK when the worker of `descriptor_base64` (a PDKV descriptor, base64) is
  // a registered decode node's; InvalidArgument for a descriptor that does not parse;
  // PermissionDenied when a refresh that started after this call answered without it;
  // Unavailable when no proxy answered that refresh. At once (on the caller's thread) when the
  // address is known or the descriptor unreadable, else on an HTTP client thread: `done` must
  // not block.
  void check(const std::string& descriptor_base64, std::function<void(const Status&)> done);
  // The known set only, no refresh.
  bool contains(const std::vector<std::uint8_t>& worker_address) const;
  // Refreshes completed so far (each: every proxy answered or failed), for tests.
  std::uint64_t refreshes() const;

 private:
  struct Waiter {
    std::string worker_address;
    std::uint64_t needs_refresh = 0;  // answered once this refresh has completed
    std::function<void(const Status&)> done;
  };
  using Answer = std::pair<std::function<void(const Status&)>, Status>;

  KvPeerAllowlist(KvPeerAllowlistOptions options, std::vector<http::BaseUrl> proxies,
                  std::unique_ptr<http::HttpClient> client);
  bool known(const std::string& worker_address) const;  // with mutex_ held
  void start_refresh();                                 // with mutex_ held
  // One proxy's answer (or failure) to refresh `generation`.
  void proxy_answered(size_t proxy, std::uint64_t generation,
                      const Result<http::ClientResponse>& response);
  // With mutex_ held: the answers of the waiters `generation` settles.
  std::vector<Answer> settle(std::uint64_t generation);

  KvPeerAllowlistOptions options_;
  std::vector<http::BaseUrl> proxies_;
  mutable std::mutex mutex_;
  std::vector<std::set<std::string>> by_proxy_;  // worker addresses, as each proxy last listed
  std::vector<Waiter> waiters_;
  std::uint64_t started_ = 0;    // refreshes started; the one in flight is number started_
  std::uint64_t completed_ = 0;  // refreshes completed
  bool refreshing_ = false;
  size_t outstanding_ = 0;  // proxies yet to answer the refresh in flight
  size_t answered_ = 0;     // proxies that answered it with a list
  bool stopping_ = false;
  // Last: destroyed first, while its callbacks may still run on the members above.
  std::unique_ptr<http::HttpClient> client_;
};

}  // namespace pdserve::kv_transfer
