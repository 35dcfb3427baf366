#include "kv_transfer/kv_peer_allowlist.h"

#include <utility>

#include "common/cluster/cluster_auth.h"
#include "common/cluster/cluster_messages.h"
#include "common/core/json_depth.h"
#include "common/core/log.h"
#include "common/protocol/pdserve_headers.h"
#include "kv_transfer/descriptor.h"

namespace pdserve::kv_transfer {
namespace {

// A descriptor's worker address, as bytes; InvalidArgument when it does not parse.
Result<std::string> worker_address_of(const std::string& descriptor_base64) {
  Result<std::string> bytes = base64_decode(descriptor_base64);
  Result<PeerDescriptor> descriptor =
      bytes.ok() ? parse_descriptor(*bytes) : Result<PeerDescriptor>(bytes.status());
  if (!descriptor.ok()) {
    return invalid_argument("the KV descriptor is unreadable: " + descriptor.status().message());
  }
  return std::string(descriptor->worker_address.begin(), descriptor->worker_address.end());
}

// A proxy's list as a set of worker addresses; descriptors that do not parse are left out.
Result<std::set<std::string>> worker_addresses(const http::ClientResponse& response) {
  if (response.status != 200) {
    return unavailable("GET /cluster/kv-peers answered HTTP " + std::to_string(response.status));
  }
  PDS_ASSIGN_OR_RETURN(const nlohmann::json body,
                       parse_json_bounded(response.body, "the KV peer list"));
  PDS_ASSIGN_OR_RETURN(const KvPeerList list, KvPeerList::parse(body));
  std::set<std::string> addresses;
  for (const std::string& descriptor : list.kv_descriptors) {
    if (Result<std::string> address = worker_address_of(descriptor); address.ok()) {
      addresses.insert(std::move(*address));
    }
  }
  return addresses;
}

void answer(std::vector<std::pair<std::function<void(const Status&)>, Status>> answers) {
  for (auto& [done, status] : answers) done(status);
}

}  // namespace

Result<std::unique_ptr<KvPeerAllowlist>> KvPeerAllowlist::create(KvPeerAllowlistOptions options) {
  std::vector<http::BaseUrl> proxies;
  for (const std::string& url : options.proxy_urls) {
    PDS_ASSIGN_OR_RETURN(http::BaseUrl base, http::parse_base_url(url));
    proxies.push_back(std::move(base));
  }
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<http::HttpClient> client, http::HttpClient::create(1));
  std::unique_ptr<KvPeerAllowlist> allowlist(
      new KvPeerAllowlist(std::move(options), std::move(proxies), std::move(client)));
  if (!allowlist->proxies_.empty()) {
    std::unique_lock lock(allowlist->mutex_);
    allowlist->start_refresh();
  }
  return allowlist;
}

KvPeerAllowlist::KvPeerAllowlist(KvPeerAllowlistOptions options, std::vector<http::BaseUrl> proxies,
                                 std::unique_ptr<http::HttpClient> client)
    : options_(std::move(options)),
      proxies_(std::move(proxies)),
      by_proxy_(proxies_.size()),
      client_(std::move(client)) {}

KvPeerAllowlist::~KvPeerAllowlist() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  client_.reset();  // the fetches in flight end (Cancelled) and settle their waiters
  std::vector<Answer> left;
  {
    std::lock_guard lock(mutex_);
    for (Waiter& waiter : waiters_) {
      left.emplace_back(std::move(waiter.done), unavailable("the prefill node is stopping"));
    }
    waiters_.clear();
  }
  answer(std::move(left));
}

bool KvPeerAllowlist::known(const std::string& worker_address) const {
  for (const std::set<std::string>& addresses : by_proxy_) {
    if (addresses.contains(worker_address)) return true;
  }
  return false;
}

bool KvPeerAllowlist::contains(const std::vector<std::uint8_t>& worker_address) const {
  std::lock_guard lock(mutex_);
  return known(std::string(worker_address.begin(), worker_address.end()));
}

std::uint64_t KvPeerAllowlist::refreshes() const {
  std::lock_guard lock(mutex_);
  return completed_;
}

void KvPeerAllowlist::check(const std::string& descriptor_base64,
                            std::function<void(const Status&)> done) {
  Result<std::string> address = worker_address_of(descriptor_base64);
  if (!address.ok()) {
    done(address.status());
    return;
  }
  if (proxies_.empty()) {
    done(permission_denied(
        "this prefill node has no --proxy to learn its decode nodes' UCX workers from, so it "
        "sends KV to none (start it with --proxy, or --insecure-unregistered-kv-peers)"));
    return;
  }
  std::unique_lock lock(mutex_);
  if (known(*address)) {
    lock.unlock();
    done(Status::ok_status());
    return;
  }
  if (stopping_) {
    lock.unlock();
    done(unavailable("the prefill node is stopping"));
    return;
  }
  // The refresh in flight may have read the proxies before the decode node registered: the
  // next one counts.
  waiters_.push_back({std::move(*address), started_ + 1, std::move(done)});
  if (!refreshing_) start_refresh();  // else the refresh in flight starts the next
}

void KvPeerAllowlist::start_refresh() {
  refreshing_ = true;
  outstanding_ = proxies_.size();
  answered_ = 0;
  const std::uint64_t generation = ++started_;
  for (size_t proxy = 0; proxy < proxies_.size(); ++proxy) {
    http::ClientRequest request;
    request.method = "GET";
    request.target = "/cluster/kv-peers";
    request.headers.emplace_back(std::string(kAuthorizationHeader),
                                 cluster_auth_header_value(options_.cluster_token));
    request.timeout = options_.refresh_timeout;
    // The client answers on its own threads, never inside fetch(): the lock held here is safe.
    client_->fetch(proxies_[proxy], std::move(request),
                   [this, proxy, generation](Result<http::ClientResponse> response) {
                     proxy_answered(proxy, generation, response);
                   });
  }
}

void KvPeerAllowlist::proxy_answered(size_t proxy, std::uint64_t generation,
                                     const Result<http::ClientResponse>& response) {
  Result<std::set<std::string>> addresses = response.ok()
                                                ? worker_addresses(*response)
                                                : Result<std::set<std::string>>(response.status());
  std::vector<Answer> answers;
  {
    std::lock_guard lock(mutex_);
    if (addresses.ok()) {
      by_proxy_[proxy] = std::move(*addresses);  // a proxy that failed keeps its last list
      ++answered_;
    } else if (!stopping_) {
      PDS_LOG_WARN("KV peer list from proxy " + proxies_[proxy].to_string() + ": " +
                   addresses.status().message());
    }
    if (generation != started_ || --outstanding_ > 0) return;
    answers = settle(generation);
  }
  answer(std::move(answers));
}

std::vector<KvPeerAllowlist::Answer> KvPeerAllowlist::settle(std::uint64_t generation) {
  completed_ = generation;
  refreshing_ = false;
  std::vector<Answer> answers;
  std::erase_if(waiters_, [&](Waiter& waiter) {
    if (stopping_) {
      answers.emplace_back(std::move(waiter.done), unavailable("the prefill node is stopping"));
      return true;
    }
    if (known(waiter.worker_address)) {
      answers.emplace_back(std::move(waiter.done), Status::ok_status());
      return true;
    }
    if (waiter.needs_refresh > generation) return false;
    answers.emplace_back(
        std::move(waiter.done),
        answered_ == 0
            ? unavailable("no proxy of this prefill node answered for its registered decode nodes")
            : permission_denied(
                  "the KV descriptor's UCX worker is not that of a decode node registered at this "
                  "prefill node's proxies: refused before UCX saw it"));
    return true;
  });
  // Checks that came during this refresh wait for one that started after them.
  if (!waiters_.empty()) start_refresh();
  return answers;
}

}  // namespace pdserve::kv_transfer
