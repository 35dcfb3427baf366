#include "proxy/proxy_server.h"
#include "proxy/exchange_state.h"  // the Exchange's lifecycle

#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "common/api/translated_routes.h"
#include "common/cluster/cluster_auth.h"
#include "common/core/json_depth.h"
#include "common/core/log.h"
#include "common/http/api_error_response.h"
#include "common/http/service_routes.h"
#include "common/protocol/openai_error.h"
#include "common/protocol/pdserve_headers.h"
#include "proxy/address_redaction.h"
#include "proxy/client_request_guard.h"
#include "proxy/timeline_relay.h"
#include "proxy/tracing/tracer.h"

namespace pdserve::proxy {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

const std::vector<double> kLatencyBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                             0.025,  0.05,    0.1,    0.25,  0.5,    1.0,   2.5,
                                             5.0,    10.0,    20.0,   40.0,  80.0,   160.0};

http::HttpResponse json_response(int status, const Json& body) {
  return {status, "application/json", {}, body.dump()};
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// A final answer that has no content by definition (RFC 9110: 204, 205, 304): never what a
// node owes an API call, and not relayable as one (the proxy asked no conditional request).
bool has_no_content(int status) { return status == 204 || status == 205 || status == 304; }

ApiError contentless_answer(int status) {
  return bad_gateway("the decode node answered HTTP " + std::to_string(status) +
                     " (no content) instead of a response");
}

}  // namespace

struct ProxyServer::Exchange {
  std::shared_ptr<http::ResponseChannel> channel;
  std::string target;
  std::string body;
  http::HeaderList forward_headers;
  int64_t prompt_estimate = 0;
  std::vector<int32_t> prompt_ids;  // the prompt's leading ids (cache-aware routing), or none
  Clock::time_point arrival = Clock::now();
  // The same instant on the wall clock: OTLP spans carry unix times.
  std::chrono::system_clock::time_point arrival_wall = std::chrono::system_clock::now();
  http::TraceContext trace;
  std::string client_span_id;  // the client's traceparent span, the parent of the proxy's
  std::vector<RouteAttempt> routes;  // one per try, for the timeline
  bool wants_timeline = false;       // the client sent X-Pdserve-Timeline: 1
  bool holds_cluster_token = false;  // may see node addresses and ids

  std::mutex mutex;
  // Where the exchange stands and what comes next (exchange_state.h); driven under `mutex`.
  ExchangeLifecycle lifecycle;
  std::vector<std::string> tried;  // decode node ids
  int attempts = 0;
  // The current attempt.
  std::shared_ptr<http::ClientCall> call;
  NodeRef decode;
  std::string prefill_id;
  std::string refusal;  // the body of a refusal another node may replace (its first 4 KiB)
  // The last refusal's error body: what the client gets when no decode node is left, rather
  // than a generic message that drops the reason (e.g. every prefill node failed).
  std::string last_refusal;
  std::string content_type;
  std::string buffered;
  Clock::time_point head_at;
  SseRelay relay;
};

ProxyServer::ProxyServer(NodeRegistry& registry, http::HttpClient& client, ProxyOptions options)
    : registry_(registry),
      client_(client),
      options_(std::move(options)),
      retries_(
          metrics_.counter("pdserve:proxy_retries_total", "Requests sent to another decode node.")),
      upstream_failures_(
          metrics_.counter("pdserve:proxy_upstream_failures_total", "Decode nodes that failed.")),
      stream_resumes_(metrics_.counter("pdserve:proxy_stream_resumes_total",
                                       "Streams continued on another decode node after theirs "
                                       "failed.")),
      routing_time_(metrics_.histogram("pdserve:proxy_routing_seconds",
                                       "Arrival to the upstream request.", kLatencyBuckets)),
      first_byte_time_(metrics_.histogram(
          "pdserve:proxy_time_to_first_byte_seconds",
          "Arrival to the first response byte from the decode node.", kLatencyBuckets)),
      e2e_time_(metrics_.histogram("pdserve:proxy_e2e_request_latency_seconds",
                                   "Arrival to the end of the response.", kLatencyBuckets)),
      placer_(registry, options_.tokenizer, options_.access.cluster_token, options_.placement,
              metrics_),
      advisor_(options_.advice),
      traces_(options_.trace_capacity) {
  declare_timeline_metrics(metrics_);
}

void ProxyServer::count_response(int status) {
  metrics_
      .counter("pdserve:proxy_http_requests_total", "Proxy responses by status code.",
               {{"status", std::to_string(status)}})
      .inc();
}

void ProxyServer::register_routes(http::RouteTable& router) {
  const AccessPolicy& access = options_.access;
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    router.add(
        "POST", path,
        guarded(access, RouteAccess::kClient,
                [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
                  handle_generation(request, ch);
                }));
  }
  // Answered by any decode node: every node of the pool serves the same model.
  const auto forwarded = [this, &access] {
    return guarded(
        access, RouteAccess::kClient,
        [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
          forward_to_decode(request, ch);
        });
  };
  // The Responses and Messages APIs go the chat path's way (common/api): phase routing, prefix
  // placement and stream resumption included; count_tokens is a decode node's /tokenize.
  api::add_translated_routes(
      router, access,
      {[this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
         handle_generation(request, ch);
       },
       [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
         forward_to_decode(request, ch);
       }});
  router.add("GET", "/v1/models", forwarded());
  router.add_prefix("GET", "/v1/models/", forwarded());
  router.add("POST", "/tokenize", forwarded());
  router.add("POST", "/detokenize", forwarded());
  router.add("GET", "/trace",
             guarded(access, RouteAccess::kCluster,
                     [this](const http::HttpRequest& request,
                            std::shared_ptr<http::ResponseChannel> ch) {
                       ch->send(traces_.handle(request));
                     }));
  http::add_service_routes(router, [this]() -> std::optional<std::string> {
    const auto now = Clock::now();
    if (!registry_.has_node(NodeRole::kDecode, now)) return "no decode node is up";
    if (options_.ready_needs_prefill && !registry_.has_node(NodeRole::kPrefill, now)) {
      return "no prefill node is up (--ready-needs-prefill)";
    }
    return std::nullopt;
  });
  router.add("GET", "/metrics",
             [this](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> ch) {
               metrics_
                   .gauge("pdserve:proxy_prefix_index_keys",
                          "Prefix-cache block keys the proxy holds for all nodes.")
                   .set(static_cast<double>(registry_.prefix_keys()));
               metrics_
                   .gauge("pdserve:proxy_tiered_index_keys",
                          "KV-tier block keys (host memory, disk) the proxy holds for all nodes.")
                   .set(static_cast<double>(registry_.tiered_keys()));
               // The advice gauges are computed when scraped, like /cluster/advice.
               const auto now = Clock::now();
               const ClusterLoad load{registry_.pool_load(NodeRole::kPrefill, now),
                                      registry_.pool_load(NodeRole::kDecode, now)};
               export_advice_metrics(advisor_.advise(load, now), load, metrics_);
               ch->send({200, "text/plain; version=0.0.4", {}, metrics_.render()});
             });
  router.add("GET", "/cluster",
             guarded(access, RouteAccess::kCluster,
                     [this](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> ch) {
                       const auto now = Clock::now();
                       expire_nodes(now);
                       ch->send(json_response(200, registry_.to_json(now)));
                     }));
  router.add("GET", "/cluster/advice",
             guarded(access, RouteAccess::kCluster,
                     [this](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> ch) {
                       const auto now = Clock::now();
                       expire_nodes(now);
                       const ClusterLoad load{registry_.pool_load(NodeRole::kPrefill, now),
                                              registry_.pool_load(NodeRole::kDecode, now)};
                       ch->send(json_response(200, advisor_.to_json(load, now)));
                     }));
  // The UCX workers this proxy's prefill nodes may send KV to (kv_transfer/kv_peer_allowlist.h).
  router.add("GET", "/cluster/kv-peers",
             guarded(access, RouteAccess::kCluster,
                     [this](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> ch) {
                       ch->send(json_response(200, registry_.decode_kv_peers().to_json()));
                     }));
  router.add(
      "POST", "/cluster/nodes",
      guarded(access, RouteAccess::kCluster,
              [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
                const Result<Json> body = parse_json_bounded(request.body, "the registration body");
                Result<std::string> id =
                    body.ok() ? registry_.register_node(*body, Clock::now()) : body.status();
                if (!id.ok()) {
                  PDS_LOG_WARN("registration refused: " + id.status().message());
                  ApiError error = api_error_from_status(id.status());
                  if (id.status().code() == StatusCode::kFailedPrecondition) {
                    error.http_status = 409;
                  }
                  ch->send(http::api_error_response(error));
                  return;
                }
                PDS_LOG_INFO("node " + *id + " registered: " + body->dump());
                ch->send(json_response(200, RegistrationReply{*id}.to_json()));
              }));
  for (const char* method : {"POST", "DELETE"}) {
    router.add_prefix(
        method, "/cluster/nodes/",
        guarded(access, RouteAccess::kCluster,
                [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
                  handle_node_call(request, ch);
                }));
  }
}

void ProxyServer::handle_node_call(const http::HttpRequest& request,
                                   const std::shared_ptr<http::ResponseChannel>& channel) {
  std::string_view rest =
      std::string_view(request.path).substr(std::string_view("/cluster/nodes/").size());
  const size_t slash = rest.find('/');
  const std::string id(rest.substr(0, slash));
  const std::string_view action =
      slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  Status status;
  if (request.method == "DELETE" && action.empty()) {
    status = registry_.remove(id);
    if (status.ok()) PDS_LOG_INFO("node " + id + " left the cluster");
  } else if (request.method == "POST" && action == "heartbeat") {
    const Result<Json> body = parse_json_bounded(request.body, "the heartbeat body");
    Result<NodeState> state =
        body.ok() ? registry_.heartbeat(id, *body, Clock::now()) : body.status();
    if (state.ok()) {
      channel->send(
          json_response(200, HeartbeatReply{id, *state}.to_json()));
      return;
    }
    PDS_LOG_WARN(state.status().message());
    if (state.status().code() == StatusCode::kFailedPrecondition) {
      // Gone, not unknown: a drained node must stop rather than register again.
      ApiError error = api_error_from_status(state.status());
      error.http_status = 410;
      channel->send(http::api_error_response(error));
      return;
    }
    status = state.status();
  } else if (request.method == "POST" && action == "drain") {
    status = registry_.drain(id);
    if (status.ok()) PDS_LOG_INFO("node " + id + " is draining");
  } else {
    channel->send(http::api_error_response(route_not_found(request.method, request.path)));
    return;
  }
  if (!status.ok()) {
    channel->send(http::api_error_response(api_error_from_status(status)));
    return;
  }
  channel->send(json_response(200, Json{{"id", id}, {"ok", true}}));
}

void ProxyServer::forward_to_decode(const http::HttpRequest& request,
                                    const std::shared_ptr<http::ResponseChannel>& channel) {
  if (std::optional<ApiError> refusal = cluster_only_field_refusal(request.body)) {
    channel->send(http::api_error_response(*refusal));
    return;
  }
  std::optional<NodeRef> decode = registry_.pick_decode({}, Clock::now());
  if (!decode) {
    channel->send(http::api_error_response(service_unavailable("no decode node is available", 1)));
    return;
  }
  http::ClientRequest upstream;
  upstream.method = request.method;
  upstream.target = request.target;
  upstream.body = request.body;
  upstream.headers.emplace_back(std::string(kAuthorizationHeader),
                                cluster_auth_header_value(options_.access.cluster_token));
  upstream.timeout = std::chrono::seconds(10);
  const std::string what = request.method + " " + request.path;
  // What errors a client without the token must not see: empty for a token holder.
  const std::string secret = bearer_matches(request, options_.access.cluster_token)
                                 ? std::string()
                                 : options_.access.cluster_token;
  client_.fetch(
      decode->base, std::move(upstream),
      [channel, decode = *decode, what, secret](Result<http::ClientResponse> response) {
        if (!response.ok()) {
          PDS_LOG_WARN(what + " on decode node " + decode.id + " (" + decode.url +
                       ") failed: " + response.status().message());
          channel->send(http::api_error_response(
              service_unavailable("the decode node asked did not answer", 1)));
          return;
        }
        if (has_no_content(response->status)) {
          channel->send(http::api_error_response(contentless_answer(response->status)));
          return;
        }
        if (response->status != 200 && !secret.empty()) {
          response->body = redact_error_body(response->body, secret);
        }
        channel->send({response->status, "application/json", {}, std::move(response->body)});
      });
}

void ProxyServer::handle_generation(const http::HttpRequest& request,
                                    const std::shared_ptr<http::ResponseChannel>& channel) {
  if (std::optional<ApiError> refusal = cluster_only_field_refusal(request.body)) {
    count_response(400);
    channel->send(http::api_error_response(*refusal));
    return;
  }
  auto exchange = std::make_shared<Exchange>();
  exchange->channel = channel;
  exchange->target = request.path;
  exchange->body = request.body;
  // A rough token count for load accounting, unless the prompt is tokenized whole here.
  exchange->prompt_estimate = static_cast<int64_t>(request.body.size() / 4);
  if (std::optional<PromptTokens> tokens = placer_.tokenize(
          request.path == "/v1/chat/completions" ? PromptKind::kChat : PromptKind::kCompletion,
          request.body)) {
    if (tokens->whole) exchange->prompt_estimate = static_cast<int64_t>(tokens->ids.size());
    exchange->prompt_ids = std::move(tokens->ids);
  }
  const std::optional<std::string_view> traceparent = request.header(kTraceparentHeader);
  exchange->trace = trace_ids_.context_for(traceparent);
  if (const std::optional<http::TraceParent> client =
          traceparent ? http::parse_traceparent(*traceparent) : std::nullopt) {
    exchange->client_span_id = client->parent_id;
  }
  exchange->forward_headers.emplace_back(std::string(kTraceparentHeader),
                                         exchange->trace.traceparent());
  exchange->wants_timeline = timeline_requested(request.header(kTimelineHeader));
  exchange->holds_cluster_token = bearer_matches(request, options_.access.cluster_token);
  // The proxy always wants the node's timeline: its traces and latency histograms need it.
  exchange->forward_headers.emplace_back(std::string(kTimelineHeader), "1");
  exchange->forward_headers.emplace_back(std::string(kAuthorizationHeader),
                                         cluster_auth_header_value(options_.access.cluster_token));
  // Streams come with checkpoints, so a failed node's stream can be resumed.
  if (options_.stream_resume) {
    exchange->forward_headers.emplace_back(std::string(kResumableHeader), "1");
  }
  channel->on_cancel([weak = std::weak_ptr<Exchange>(exchange)] {
    if (auto ex = weak.lock()) {
      std::lock_guard lock(ex->mutex);
      if (ex->lifecycle.client_left().cancel_call && ex->call) ex->call->cancel();
    }
  });
  attempt(exchange);
}

void ProxyServer::expire_nodes(Clock::time_point now) {
  for (const std::string& id : registry_.expire(now)) {
    std::vector<std::weak_ptr<Exchange>> waiting;
    {
      std::lock_guard lock(in_flight_mutex_);
      if (auto it = in_flight_.find(id); it != in_flight_.end()) {
        waiting = std::move(it->second);
        in_flight_.erase(it);
      }
    }
    int cancelled = 0;
    for (const std::weak_ptr<Exchange>& weak : waiting) {
      const std::shared_ptr<Exchange> exchange = weak.lock();
      if (!exchange) continue;
      std::lock_guard lock(exchange->mutex);
      // An exchange that moved on to another node is that node's business.
      if (!exchange->lifecycle.calling() || !exchange->call || exchange->decode.id != id) continue;
      exchange->call->cancel();  // on_done reroutes it or ends it with an error
      ++cancelled;
    }
    PDS_LOG_WARN("node " + id + " stopped sending heartbeats: dropped, " +
                 std::to_string(cancelled) + " request(s) in flight there rerouted or failed");
  }
}

void ProxyServer::track_in_flight(const std::string& decode_id,
                                  const std::shared_ptr<Exchange>& exchange) {
  std::lock_guard lock(in_flight_mutex_);
  std::vector<std::weak_ptr<Exchange>>& waiting = in_flight_[decode_id];
  std::erase_if(waiting, [](const std::weak_ptr<Exchange>& weak) { return weak.expired(); });
  waiting.push_back(exchange);
}

void ProxyServer::attempt(const std::shared_ptr<Exchange>& exchange) {
  const Clock::time_point now = Clock::now();
  expire_nodes(now);
  std::lock_guard lock(exchange->mutex);
  if (exchange->lifecycle.state() != ExchangeState::kRouting) return;  // the client left
  std::string body = exchange->body;
  if (exchange->lifecycle.client_stream_open()) {
    Result<std::string> resumed = resumed_body(*exchange);
    if (!resumed.ok()) {
      PDS_LOG_WARN("a stream cannot be resumed: " + resumed.status().message());
      carry_out(*exchange, exchange->lifecycle.resume_unreadable());
      return;
    }
    body = std::move(resumed).value();
  }
  const RoutingQuery query{exchange->prompt_ids, exchange->prompt_estimate};
  std::optional<RequestPlacement> placed = exchange->attempts < options_.max_attempts
                                               ? placer_.place(query, exchange->tried, now)
                                               : std::nullopt;
  if (!placed) {
    carry_out(*exchange, exchange->lifecycle.no_node());
    return;
  }
  const NodeRef* decode = &placed->decode;
  ++exchange->attempts;
  exchange->tried.push_back(decode->id);
  exchange->decode = *decode;
  exchange->lifecycle.call_started();
  exchange->refusal.clear();
  exchange->buffered.clear();
  // A resumption carries over what the client already has.
  exchange->relay = SseRelay(exchange->relay.delivered());
  if (!exchange->holds_cluster_token) exchange->relay.redact_errors(options_.access.cluster_token);
  const std::vector<NodeRef>& prefill = placed->prefill;
  const PrefillPlacement placement = placed->placement;
  const bool remote = placement == PrefillPlacement::kRemote;
  exchange->prefill_id = placed->prefill_id;
  registry_.begin_request(decode->id, exchange->prefill_id, exchange->prompt_estimate);

  http::ClientRequest upstream;
  upstream.method = "POST";
  upstream.target = exchange->target;
  upstream.body = std::move(body);
  upstream.headers = exchange->forward_headers;
  upstream.timeout = options_.request_timeout;
  upstream.head_timeout = options_.first_byte_timeout;
  upstream.idle_timeout = options_.stream_idle_timeout;
  if (remote) {
    std::string urls;
    for (const NodeRef& node : prefill) urls += (urls.empty() ? "" : ",") + node.url;
    upstream.headers.emplace_back(std::string(kPrefillHeader), std::move(urls));
  }
  routing_time_.observe(seconds_since(exchange->arrival));

  // The callbacks own the exchange until the call ends (on_done drops the call).
  const std::shared_ptr<Exchange>& strong = exchange;
  const bool can_retry = exchange->attempts < options_.max_attempts;
  http::StreamCallbacks callbacks;
  callbacks.on_head = [this, ex = strong, can_retry](int status, const http::HeaderList& headers) {
    std::lock_guard guard(ex->mutex);
    ex->head_at = Clock::now();
    ex->content_type = std::string(http::find_header(headers, "Content-Type").value_or(""));
    carry_out(*ex, ex->lifecycle.head({status, ex->content_type.starts_with("text/event-stream"),
                                       has_no_content(status), can_retry}));
  };
  callbacks.on_body = [this, ex = strong](std::string_view bytes) {
    std::lock_guard guard(ex->mutex);
    const BodyAction action = ex->lifecycle.body();
    if (action.first_byte) first_byte_time_.observe(seconds_since(ex->arrival));
    switch (action.use) {
      case BodyUse::kIgnore:
      case BodyUse::kDrop:
        return;
      case BodyUse::kRefusal:
        if (ex->refusal.size() < 4096) {
          ex->refusal.append(bytes.substr(0, 4096 - ex->refusal.size()));
        }
        return;
      case BodyUse::kBuffer:
        if (bytes.size() > kMaxBufferedAnswerBytes - ex->buffered.size()) {
          ex->buffered.clear();
          carry_out(*ex, ex->lifecycle.buffer_overflowed());
          return;
        }
        ex->buffered.append(bytes);
        return;
      case BodyUse::kRelay:
        break;
    }
    std::string out = ex->relay.feed(bytes);
    if (!out.empty() && !ex->channel->write(std::move(out))) {
      carry_out(*ex, ex->lifecycle.client_write_failed());  // gone, or cannot keep up
    } else if (ex->relay.overflowed()) {
      carry_out(*ex, ex->lifecycle.relay_overflowed());
    }
  };
  callbacks.on_done = [this, ex = strong](const Status& outcome) {
    bool again = false;
    {
      std::lock_guard guard(ex->mutex);
      ex->call.reset();
      registry_.end_request(ex->decode.id, ex->prefill_id, ex->prompt_estimate);
      const char* during = exchange_state_name(ex->lifecycle.state());
      const ExchangeActions actions =
          ex->lifecycle.call_ended(outcome.ok(), ex->relay.delivered().resumable());
      if (actions.node_failed) {
        PDS_LOG_WARN("decode node " + ex->decode.id + " (" + ex->decode.url + ") failed while " +
                     during + ": " + outcome.message());
      }
      again = carry_out(*ex, actions);
    }
    if (again) attempt(ex);
  };
  exchange->routes.push_back({exchange->routes.empty() ? 0.0 : ms_between(exchange->arrival, now),
                              ms_between(exchange->arrival, Clock::now()), decode->id,
                              exchange->prefill_id,
                              std::string(prefill_placement_name(placement))});
  exchange->call = client_.stream(decode->base, std::move(upstream), std::move(callbacks));
  track_in_flight(decode->id, exchange);
}

bool ProxyServer::carry_out(Exchange& exchange, const ExchangeActions& actions) {
  if (actions.node_failed) {
    registry_.mark_down(exchange.decode.id, Clock::now());
    upstream_failures_.inc();
  }
  if (actions.keep_refusal) exchange.last_refusal = std::move(exchange.refusal);
  if (actions.count_retry) retries_.inc();
  if (actions.count_resume) stream_resumes_.inc();
  if (actions.open_client_stream) {
    exchange.channel->start_stream(exchange.lifecycle.status(), exchange.content_type, {});
  }
  if (actions.cancel_call && exchange.call) exchange.call->cancel();
  conclude(exchange, actions.end);
  return actions.route_again;
}

void ProxyServer::conclude(Exchange& exchange, ExchangeEnd end) {
  const int status = exchange.lifecycle.status();
  const auto stream_error = [&](const ApiError& error) {
    count_response(200);
    record_failure(exchange);
    end_stream_with_error(exchange, error);
  };
  const ApiError node_failed =
      service_unavailable("the decode node serving this request failed", 1);
  const std::string no_node = exchange.tried.empty()
                                  ? "no decode node is available"
                                  : "no decode node could take the request (tried " +
                                        std::to_string(exchange.tried.size()) + ")";
  switch (end) {
    case ExchangeEnd::kNone:
      return;
    case ExchangeEnd::kAnswer:
      relay_answer(exchange);
      return;
    case ExchangeEnd::kContentless:
      PDS_LOG_WARN("decode node " + exchange.decode.id + " answered HTTP " +
                   std::to_string(status) + " to a generation request");
      count_response(502);
      record_failure(exchange);
      exchange.channel->send(http::api_error_response(contentless_answer(status)));
      return;
    case ExchangeEnd::kAnswerTooLarge:
      PDS_LOG_WARN("decode node " + exchange.decode.id + " sent a whole answer over " +
                   std::to_string(kMaxBufferedAnswerBytes) + " bytes: refused");
      count_response(502);
      record_failure(exchange);
      exchange.channel->send(http::api_error_response(bad_gateway(
          "the decode node's answer is over " + std::to_string(kMaxBufferedAnswerBytes) +
          " bytes")));
      return;
    case ExchangeEnd::kNodeFailed:
      if (exchange.lifecycle.client_stream_open()) return stream_error(node_failed);
      count_response(503);
      record_failure(exchange);
      exchange.channel->send(http::api_error_response(node_failed));
      return;
    case ExchangeEnd::kAllBusy:
      // Backpressure: the decode pool is full, not broken; the client should come back.
      count_response(429);
      exchange.channel->send(http::api_error_response(too_many_requests(
          "every decode node is full (KV pool, sequences or queue); " + no_node, 1)));
      return;
    case ExchangeEnd::kNoNode:
      count_response(503);
      record_failure(exchange);
      if (exchange.last_refusal.empty()) {
        exchange.channel->send(http::api_error_response(service_unavailable(no_node, 1)));
        return;
      }
      // The decode node's own reason (its 503 body), addresses redacted for the client.
      exchange.channel->send(
          {503,
           "application/json",
           {{"Retry-After", "1"}},
           exchange.holds_cluster_token
               ? exchange.last_refusal
               : redact_error_body(exchange.last_refusal, options_.access.cluster_token)});
      return;
    case ExchangeEnd::kNoNodeToResume:
      return stream_error(service_unavailable(
          "the decode node serving this request failed and no other could continue the stream", 1));
    case ExchangeEnd::kResumeUnreadable:
      return stream_error(node_failed);
    case ExchangeEnd::kResumeRefused:
      // Its status and body are not the client's stream.
      PDS_LOG_WARN("decode node " + exchange.decode.id + " refused to resume a stream: HTTP " +
                   std::to_string(status));
      return stream_error(service_unavailable(
          "the decode node serving this request failed and the stream could not be resumed", 1));
    case ExchangeEnd::kEventTooLarge:
      PDS_LOG_WARN("decode node " + exchange.decode.id + " sent an SSE event over " +
                   std::to_string(kMaxSseHeldBytes) + " bytes: the stream is cut");
      return stream_error(bad_gateway("the decode node sent an SSE event over " +
                                      std::to_string(kMaxSseHeldBytes) + " bytes"));
  }
}

void ProxyServer::relay_answer(Exchange& exchange) {
  count_response(exchange.lifecycle.status());
  e2e_time_.observe(seconds_since(exchange.arrival));
  if (!exchange.lifecycle.client_stream_open()) {
    exchange.channel->send(
        {exchange.lifecycle.status(),
         exchange.content_type.empty() ? "application/json" : exchange.content_type,
         {},
         relay_body(exchange, std::move(exchange.buffered))});
    return;
  }
  if (exchange.relay.problem()) PDS_LOG_WARN(exchange.relay.problem()->message());
  const std::optional<RequestTimeline> aligned =
      exchange.relay.timeline() ? record_timeline(exchange, *exchange.relay.timeline(),
                                                  exchange.relay.usage().value_or(UsageCounts{}))
                                : std::nullopt;
  const std::optional<Json> for_client = client_timeline(exchange, aligned);
  if (std::string rest = exchange.relay.finish(for_client ? &*for_client : nullptr);
      !rest.empty()) {
    exchange.channel->write(std::move(rest));
  }
  exchange.channel->end_stream();
}

void ProxyServer::end_stream_with_error(Exchange& exchange, const ApiError& error) {
  exchange.channel->write("data: " + error.body() + "\n\n");
  exchange.channel->write("data: [DONE]\n\n");
  exchange.channel->end_stream();
}

Result<std::string> ProxyServer::resumed_body(const Exchange& exchange) {
  // Parsed only now: the proxy forwards bodies untouched, the nodes read them.
  PDS_ASSIGN_OR_RETURN(Json body, parse_json_bounded(exchange.body, "the request body"));
  if (!body.is_object()) return invalid_argument("the request body is not a JSON object");
  body[kStreamResumeField] = exchange.relay.delivered().resume().to_json();
  return body.dump();
}

std::optional<RequestTimeline> ProxyServer::record_timeline(Exchange& exchange,
                                                            const Json& node_timeline,
                                                            const UsageCounts& usage) {
  ProxyMeasurements measured;
  measured.trace_id = exchange.trace.trace_id;
  measured.routes = exchange.routes;
  measured.head_ms = ms_between(exchange.arrival, exchange.head_at);
  measured.end_ms = ms_between(exchange.arrival, Clock::now());
  Result<RequestTimeline> parsed = RequestTimeline::parse(node_timeline);
  Result<RequestTimeline> aligned =
      parsed.ok() ? align_timeline(*parsed, measured) : Result<RequestTimeline>(parsed.status());
  if (!aligned.ok()) {
    PDS_LOG_WARN("timeline from decode node " + exchange.decode.url +
                 " not recorded: " + aligned.status().message());
    return std::nullopt;
  }
  const TimelineSummary summary = summarize_timeline(*aligned);
  observe_timeline(metrics_, summary);
  const FinishedRequest finished = finished_request(summary);
  advisor_.record(finished);
  PDS_LOG_INFO("request " + aligned->request_id + " finished on " + exchange.decode.id +
               (exchange.prefill_id.empty() ? "" : " (prefill " + exchange.prefill_id + ")") +
               ": HTTP " + std::to_string(exchange.lifecycle.status()) + ", prefilled " +
               std::to_string(finished.prompt_tokens) + " tokens (the rest cached), output " +
               std::to_string(finished.output_tokens) + " tokens, TTFT " +
               std::to_string(static_cast<int64_t>(finished.ttft_ms)) + " ms, TPOT " +
               std::to_string(static_cast<int64_t>(finished.tpot_ms)) + " ms, e2e " +
               std::to_string(static_cast<int64_t>(finished.e2e_ms)) + " ms");
  const double arrival_us =
      std::chrono::duration<double, std::micro>(exchange.arrival.time_since_epoch()).count();
  traces_.record({*aligned, arrival_us});
  if (otlp_) otlp_->enqueue(*aligned, otlp_request_info(exchange, usage));
  return std::move(*aligned);
}

OtlpRequestInfo ProxyServer::otlp_request_info(const Exchange& exchange, const UsageCounts& usage) {
  OtlpRequestInfo info;
  info.root_span_id = exchange.trace.span_id;
  info.client_span_id = exchange.client_span_id;
  info.arrival_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             exchange.arrival_wall.time_since_epoch())
                             .count();
  info.prompt_tokens = usage.prompt_tokens;
  info.completion_tokens = usage.completion_tokens;
  return info;
}

void ProxyServer::record_failure(const Exchange& exchange) {
  FinishedRequest failed;
  failed.e2e_ms = ms_between(exchange.arrival, Clock::now());
  PDS_LOG_INFO("request failed on " + exchange.decode.id + " after " +
               std::to_string(static_cast<int64_t>(failed.e2e_ms)) + " ms, " +
               std::to_string(exchange.attempts) + " attempt(s)");
  failed.ok = false;
  advisor_.record(failed);
}

std::optional<Json> ProxyServer::client_timeline(const Exchange& exchange,
                                                 const std::optional<RequestTimeline>& aligned) {
  if (!exchange.wants_timeline || !aligned) return std::nullopt;
  return Json(exchange.holds_cluster_token ? aligned->to_json()
                                           : redact_timeline(*aligned).to_json());
}

std::string ProxyServer::relay_body(Exchange& exchange, std::string body) {
  if (exchange.lifecycle.status() != 200) {
    return exchange.holds_cluster_token ? body
                                        : redact_error_body(body, options_.access.cluster_token);
  }
  Result<std::optional<TimelineBody>> parsed = parse_timeline_body(body);
  if (!parsed.ok()) {
    PDS_LOG_WARN(parsed.status().message());
    return body;
  }
  if (!parsed->has_value()) return body;
  const std::optional<RequestTimeline> aligned =
      record_timeline(exchange, (*parsed)->timeline, (*parsed)->counts);
  const std::optional<Json> for_client = client_timeline(exchange, aligned);
  return (*parsed)->with_timeline(for_client ? &*for_client : nullptr);
}

}  // namespace pdserve::proxy
