// The prefill node's HTTP API: POST /internal/v1/prefill (cluster token) takes a PrefillWork
// from a decode node (common/protocol/prefill_protocol.h), runs the prompt through the engine
// (batched and chunked with other prompts, with the node's prefix cache) up to its first
// token, streams that token back at once, and ships the prompt's KV into the decode node's
// blocks; then reports kv_sent or kv_failed. POST /internal/v1/prefill/cancel (cluster token)
// aborts one such work (its own transfer only) for a decode node whose client left; the outcome
// comes on the work's stream, and the cancel is answered once no put of that work can land any
// more (PrefillCancelAnswer). GET /health, /ready and /version (common/http/service_routes.h),
// and GET /metrics.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "common/engine/inference_service.h"
#include "common/http/route_table.h"
#include "common/metrics/metrics.h"
#include "common/protocol/prefill_protocol.h"
#include "kv_transfer/kv_peer_allowlist.h"
#include "prefill_node/prefill_exchange_state.h"
#include "serving/engine_metrics.h"

namespace pdserve {

class PrefillServer {
 public:
  // `service` must outlive the server and be stopped before it is destroyed. `layout` is this
  // node's KV block layout; work for another layout is refused. `draining`: whether the proxy
  // drained this node (pdserve:node_state). `kv_peers`: the UCX workers work may name (null:
  // any, --insecure-unregistered-kv-peers).
  PrefillServer(InferenceService& service, KvBlockLayout layout, std::string cluster_token,
                std::function<bool()> draining,
                std::unique_ptr<kv_transfer::KvPeerAllowlist> kv_peers);

  void register_routes(http::RouteTable& router);
  metrics::Registry& metrics() { return metrics_; }

  struct Exchange;  // one prefill in flight (defined in prefill_server.cpp)

  // Test hook, set before the first work: runs on the connection's strand once an engine delta
  // of a work has been handled, with the engine's request id and whether the work's stream has
  // ended, so that a test can check what the delta did (or did not do) without waiting blind.
  using DeltaHandledHook = std::function<void(const std::string& engine_request_id, bool ended)>;
  void set_test_after_delta(DeltaHandledHook hook) { test_after_delta_ = std::move(hook); }

 private:
  void handle_prefill(const http::HttpRequest& request,
                      const std::shared_ptr<http::ResponseChannel>& channel);
  // The work passed every check: it runs.
  void admit(PrefillWork work, SteadyTime receipt,
             const std::shared_ptr<http::ResponseChannel>& channel);
  void handle_cancel(const http::HttpRequest& request,
                     const std::shared_ptr<http::ResponseChannel>& channel);
  void handle_metrics(const std::shared_ptr<http::ResponseChannel>& channel);
  // The work's exchange ended (its last event is written).
  void forget_work(const std::string& key);

  InferenceService& service_;
  KvBlockLayout layout_;
  std::string cluster_token_;
  std::function<bool()> draining_;
  metrics::Registry metrics_;
  // Created with the server, so that every series is there at zero from the start.
  EngineMetrics engine_metrics_;
  metrics::Counter& requests_;
  metrics::Counter& cancels_;
  metrics::Counter& prompt_tokens_;
  metrics::Histogram& queue_time_;
  metrics::Histogram& prefill_time_;
  metrics::Histogram& transfer_time_;
  metrics::Counter& transfer_bytes_;
  metrics::Counter& descriptor_refused_;
  metrics::Counter& layout_refused_;
  std::atomic<uint64_t> next_id_{0};

  // Work in flight by "request id/transfer tag", for cancel; and cancels that came before their
  // work (refused when it arrives), oldest first, bounded. A work is checked against the
  // early cancels and admitted under one lock, so a cancel either finds it or refuses it.
  std::mutex work_mutex_;
  std::map<std::string, std::shared_ptr<Exchange>> work_in_flight_;
  std::set<std::string> cancelled_early_;
  std::deque<std::string> cancelled_early_order_;
  DeltaHandledHook test_after_delta_;

  // Last: destroyed first, while the checks it still answers find the members above.
  std::unique_ptr<kv_transfer::KvPeerAllowlist> kv_peers_;
};

}  // namespace pdserve
