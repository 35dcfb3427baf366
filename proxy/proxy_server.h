// pdserve-proxy's HTTP front end: the OpenAI API (POST /v1/completions and
// /v1/chat/completions, streaming or not) routed by phase, and the Responses and Anthropic
// Messages APIs as translations of a chat completion (common/api/translated_routes.h); GET /v1/models, /v1/models/{id},
// POST /tokenize and /detokenize answered by a decode node; and the cluster API:
//   POST   /cluster/nodes                 register a node (cluster token) -> {"id": ...}
//   POST   /cluster/nodes/ID/heartbeat    load report (cluster token) -> {"state": "up" or
//                                         "draining"}; 404 for unknown ids, 410 for drained ones
//   DELETE /cluster/nodes/ID              a node leaves (cluster token)
//   POST   /cluster/nodes/ID/drain        no new work; removed when its requests are done
//   GET    /cluster                       nodes with role, state and load
//   GET    /cluster/advice                pool load, SLO attainment, recommended P:D nodes
// plus GET /health (liveness), GET /ready and /health?ready=1 (503 until a decode node is up,
// and a prefill node with ready_needs_prefill), GET /version, GET /metrics and GET /trace?last=N |
// ?request_id=ID (Chrome trace JSON of the last requests' timelines, docs/TRACING.md). /cluster*
// and /trace need the cluster token; the OpenAI API needs an API key when any is configured
// (cluster_auth.h).
//
// Clients never see internal addresses or the cluster token unless they hold it: error
// messages relayed from the nodes have them redacted, and the per-request timeline is opt-in
// (`X-Pdserve-Timeline: 1`), with node ids and addresses removed (address_redaction.h). Nor do
// they borrow the token the proxy forwards with: cluster-only body fields are a 400, client
// headers never reach a node (client_request_guard.h). A node's answer is relayed by the RFC:
// interim 1xx answers are consumed (http_client.h), 101 is a failed node, 204/205/304 a 502.
//
// A generation request goes to the decode node of lowest routing cost with the header
// X-Pdserve-Prefill listing the prefill nodes, lowest cost first (none: the decode node
// prefills itself); with a prompt tokenizer the cost weighs the prompt's cached prefix on each
// node against its load (routing/placement.h), else load alone. The proxy holds no model: the decode node validates the request, so error
// bodies are the engine's. A decode node that refuses before answering (429/503: KV pool or
// queue full, prefill nodes unreachable) or cannot be reached is skipped and the next one
// tried; a decode node that fails mid-stream gets the client an SSE error event and [DONE]
// at once, and is marked down. The response streams through as it arrives. A decode node
// that stops answering (no head within first_byte_timeout, silent for stream_idle_timeout
// mid-body) or stops sending heartbeats fails the same way, at once. Which of these happens
// is decided by each request's ExchangeLifecycle (exchange_state.h).
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/cluster/cluster_auth.h"
#include "common/http/http_client.h"
#include "common/http/route_table.h"
#include "common/http/traceparent.h"
#include "common/metrics/metrics.h"
#include "common/protocol/request_timeline.h"
#include "proxy/routing/placement.h"
#include "proxy/tracing/tracer.h"

namespace pdserve {
struct UsageCounts;  // common/protocol/stream_event.h
}

namespace pdserve::proxy {

// The most bytes of a whole (non-streamed) node answer the proxy holds before relaying it; a
// longer one is a 502 (a streamed answer is bounded per event: kMaxSseHeldBytes).
inline constexpr size_t kMaxBufferedAnswerBytes = size_t{64} << 20;

struct ExchangeActions;  // exchange_state.h
enum class ExchangeEnd;

struct ProxyOptions {
  AccessPolicy access;  // the cluster token, and the client API keys of the OpenAI API
  std::chrono::milliseconds request_timeout{600'000};  // one upstream exchange, whole
  // A decode node's response head (it covers the remote prefill and the queue: the head of a
  // remotely prefilled stream waits for its first token), and its longest silence mid-body.
  // On expiry the request goes to another decode node (no head yet) or fails.
  std::chrono::milliseconds first_byte_timeout{300'000};
  std::chrono::milliseconds stream_idle_timeout{120'000};
  // Ask decode nodes for stream checkpoints, and resume a failed node's streams elsewhere.
  bool stream_resume = true;
  int max_attempts = 3;                                // decode nodes tried per request
  AdvisorOptions advice;                               // GET /cluster/advice
  size_t trace_capacity = 1000;                        // timelines kept for GET /trace
  bool ready_needs_prefill = false;                    // GET /ready also waits for a prefill node
  // The tokenizer of cache-aware routing: learned from the nodes by default, fixed with
  // --tokenizer, none with --no-cache-aware-routing (routing/cluster_tokenizer.h).
  ClusterTokenizerOptions tokenizer;
  PlacementPolicy placement;  // where a request's prompt is prefilled (prefix_routing.h)
};

class ProxyServer {
 public:
  // `registry` and `client` must outlive the server and every exchange it started.
  ProxyServer(NodeRegistry& registry, http::HttpClient& client, ProxyOptions options);

  void register_routes(http::RouteTable& router);
  // Drops the registered nodes whose heartbeats stopped (NodeRegistry::expire), and at once
  // sends the requests in flight on such a decode node to another one (no response head yet)
  // or ends them with an error; call it periodically.
  void expire_nodes(std::chrono::steady_clock::time_point now);
  metrics::Registry& metrics() { return metrics_; }
  ClusterAdvisor& advisor() { return advisor_; }
  const RequestPlacer& placement() const { return placer_; }
  TraceRecorder& traces() { return traces_; }
  // From now on also sends each recorded request's spans to an OTLP collector.
  void export_traces(std::unique_ptr<OtlpExporter> exporter) { otlp_ = std::move(exporter); }

  struct Exchange;  // one client request being forwarded (defined in proxy_server.cpp)

 private:
  void handle_generation(const http::HttpRequest& request,
                         const std::shared_ptr<http::ResponseChannel>& channel);
  // Sends the request to a decode node as is (with the cluster token) and relays its answer.
  void forward_to_decode(const http::HttpRequest& request,
                         const std::shared_ptr<http::ResponseChannel>& channel);
  void handle_node_call(const http::HttpRequest& request,
                        const std::shared_ptr<http::ResponseChannel>& channel);
  void attempt(const std::shared_ptr<Exchange>& exchange);
  void count_response(int status);
  // Parses the decode node's timeline, aligns it to the exchange and records it (/trace,
  // trace file, histograms, OTLP); the aligned timeline, or nullopt (logged) when it cannot be
  // read. `usage`: the response's token counts, where it had them.
  std::optional<RequestTimeline> record_timeline(Exchange& exchange,
                                                 const nlohmann::json& node_timeline,
                                                 const UsageCounts& usage);
  // The OTLP span tree's ids, wall-clock arrival and the response's token counts.
  static OtlpRequestInfo otlp_request_info(const Exchange& exchange, const UsageCounts& usage);
  // Tells the advisor that the cluster could not serve the request.
  void record_failure(const Exchange& exchange);
  // Carries out what the exchange's lifecycle decided (metrics, the node marked down, the
  // client's stream opened, the call cancelled, the answer ended); true when the exchange goes
  // to the next decode node: attempt() once the exchange's mutex is released.
  bool carry_out(Exchange& exchange, const ExchangeActions& actions);
  // Ends the client's answer as `end` says (nothing for kNone).
  void conclude(Exchange& exchange, ExchangeEnd end);
  // The node's answer: the rest of the client's stream, or the whole body.
  void relay_answer(Exchange& exchange);
  // Ends a stream the client already has with an error event and [DONE].
  void end_stream_with_error(Exchange& exchange, const ApiError& error);
  // The client's body with the stream's resumption (common/protocol/stream_resume.h) added.
  static Result<std::string> resumed_body(const Exchange& exchange);
  // What the client gets of the aligned timeline: nothing (nullopt) unless it asked, and
  // then redacted unless it holds the cluster token.
  std::optional<nlohmann::json> client_timeline(const Exchange& exchange,
                                                const std::optional<RequestTimeline>& aligned);
  // A non-streaming body as the client gets it: its timeline recorded and replaced by the
  // client's (or removed), error messages redacted for a client without the token.
  std::string relay_body(Exchange& exchange, std::string body);

  // Remembers that `exchange` waits on `decode_id` (for expire_nodes).
  void track_in_flight(const std::string& decode_id, const std::shared_ptr<Exchange>& exchange);

  NodeRegistry& registry_;
  http::HttpClient& client_;
  std::mutex in_flight_mutex_;
  std::map<std::string, std::vector<std::weak_ptr<Exchange>>> in_flight_;  // by decode node id
  ProxyOptions options_;
  metrics::Registry metrics_;
  // Created with the server, so that every series is there at zero from the start.
  metrics::Counter& retries_;
  metrics::Counter& upstream_failures_;
  metrics::Counter& stream_resumes_;
  metrics::Histogram& routing_time_;
  metrics::Histogram& first_byte_time_;
  metrics::Histogram& e2e_time_;
  RequestPlacer placer_;
  ClusterAdvisor advisor_;
  http::TraceIdGenerator trace_ids_;
  TraceRecorder traces_;
  std::unique_ptr<OtlpExporter> otlp_;  // null without --otlp-traces-endpoint
};

}  // namespace pdserve::proxy
