// The tokenizer the proxy places requests with (cache-aware placement: prompt_tokenizer.h),
// one for the whole cluster. Nodes advertise their tokenizer's identity when they register
// (NodeRegistration::tokenizer_sha256, common/tokenizer/tokenizer_files.h). The proxy holds one
// identity: that of --tokenizer, else the first node's to advertise one; a registering node that
// advertises another is refused (FailedPrecondition: HTTP 409, counted in
// pdserve:proxy_tokenizer_mismatch_total), so a cluster never mixes tokenizers. Without
// --tokenizer the proxy fetches the files once, from a registered node of that identity
// (GET /cluster/tokenizer with the cluster token), checks their hash and loads them; until
// then, or when every fetch fails, requests are placed by load alone (what the proxy does
// without a tokenizer): a failing fetch costs the feature, never a request.
//
// States (TokenizerState); fetches run on a thread and an HTTP client of their own, so that
// destruction interrupts a fetch in flight:
//   kOff       --no-cache-aware-routing: no tokenizer, no identity check
//   kUnknown   no node advertised a tokenizer yet
//   kFetching  identity held; the next candidate node is asked (each fetch bounded by
//              fetch_timeout; after a failure the node goes to the back of the queue and the
//              next one is tried after retry_delay, doubled per failure up to 60 s)
//   kReady     tokenizer loaded (from a node, or --tokenizer from the start)
// kUnknown -> kFetching (a node advertised an identity) -> kReady (a fetch passed the check).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "common/cluster/cluster_messages.h"
#include "common/core/status.h"
#include "common/http/http_client.h"
#include "common/metrics/metrics.h"
#include "proxy/routing/prompt_tokenizer.h"

namespace pdserve::proxy {

enum class TokenizerState { kOff, kUnknown, kFetching, kReady };
std::string_view tokenizer_state_name(TokenizerState state);  // "off", "unknown", ...

struct ClusterTokenizerOptions {
  bool enabled = true;  // false: --no-cache-aware-routing
  // --tokenizer: the tokenizer and its identity, held from the start (nothing is fetched).
  std::shared_ptr<const PromptTokenizer> fixed;
  std::string fixed_sha256;
  size_t max_text_bytes = 8'192;  // --route-max-prompt-bytes, for a fetched tokenizer
  std::chrono::milliseconds fetch_timeout{30'000};
  std::chrono::milliseconds retry_delay{1'000};
};

class ClusterTokenizer {
 public:
  // Every series it counts is in `metrics` from the start.
  ClusterTokenizer(ClusterTokenizerOptions options, std::string cluster_token,
                   metrics::Registry& metrics);
  ~ClusterTokenizer();  // stops the fetching thread, cancelling a fetch in flight
  ClusterTokenizer(const ClusterTokenizer&) = delete;
  ClusterTokenizer& operator=(const ClusterTokenizer&) = delete;

  // A node registering: OK (a node advertising no identity is let in unchecked), or
  // FailedPrecondition naming both identities when it advertises another than the proxy's.
  Status admit(const NodeRegistration& registration);
  // The tokenizer to place with; null until kReady.
  std::shared_ptr<const PromptTokenizer> current() const;
  TokenizerState state() const;
  // Waits until kReady or `deadline`; whether ready.
  bool wait_until_ready(std::chrono::steady_clock::time_point deadline) const;

 private:
  struct Candidate {
    std::string url;
    http::BaseUrl base;
  };

  void fetch_loop();
  // GET /cluster/tokenizer at `node`; nullopt when the object is being destroyed. Called
  // with `lock` held; releases it while waiting.
  std::optional<Result<http::ClientResponse>> fetch_files(http::HttpClient& client,
                                                          const Candidate& node,
                                                          std::unique_lock<std::mutex>& lock);
  // The fetched files checked against `sha256` and loaded.
  Result<std::shared_ptr<const PromptTokenizer>> load_files(
      const Result<http::ClientResponse>& response, const std::string& sha256) const;

  ClusterTokenizerOptions options_;
  std::string cluster_token_;
  metrics::Counter& mismatches_;
  metrics::Counter& fetch_failures_;
  metrics::Gauge& in_use_;

  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  TokenizerState state_ = TokenizerState::kUnknown;
  std::string sha256_;  // the identity the proxy holds; empty in kOff and kUnknown
  std::shared_ptr<const PromptTokenizer> tokenizer_;
  std::deque<Candidate> candidates_;  // nodes of that identity, next to ask first
  std::optional<Result<http::ClientResponse>> fetched_;  // the answer of the fetch in flight
  uint64_t fetches_ = 0;                                 // fetches started
  bool stopping_ = false;
  std::thread fetcher_;  // only when tokenizers are fetched
};

}  // namespace pdserve::proxy
