#include "prefill_node/prefill_server.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>
#include <utility>

#include "common/cluster/cluster_auth.h"
#include "common/http/api_error_response.h"
#include "common/protocol/openai_error.h"

namespace pdserve {
namespace {

double milliseconds_between(SteadyTime from, SteadyTime to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

}  // namespace

// One prefill in flight: the first-token event must precede the transfer's event, but the
// transfer (on the KV thread) may finish before the engine thread delivers the token.
struct PrefillServer::Exchange {
  std::mutex mutex;
  std::shared_ptr<http::ResponseChannel> channel;
  bool token_written = false;
  bool ended = false;
  std::optional<KvTransferReport> report;  // arrived before the token

  // With the mutex held.
  void write(const PrefillEvent& event) {
    if (!ended) channel->write(prefill_event_line(event));
  }
  void end() {
    if (ended) return;
    ended = true;
    channel->end_stream();
    channel.reset();
  }
  void write_report(const KvTransferReport& transfer) {
    PrefillEvent event;
    if (transfer.status.ok()) {
      event.kind = PrefillEvent::Kind::kKvSent;
      event.bytes = transfer.bytes;
      event.blocks = transfer.blocks;
      event.transfer_ms = transfer.seconds * 1000.0;
    } else {
      event.kind = PrefillEvent::Kind::kKvFailed;
      event.error = transfer.status.message();
    }
    write(event);
    end();
  }
};

PrefillServer::PrefillServer(InferenceService& service, KvBlockLayout layout,
                             std::string cluster_token)
    : service_(service), layout_(std::move(layout)), cluster_token_(std::move(cluster_token)) {}

void PrefillServer::register_routes(http::Router& router) {
  router.add("POST", "/internal/v1/prefill",
             [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
               handle_prefill(request, ch);
             });
  router.add("GET", "/health",
             [](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> ch) {
               ch->send({200, "application/json", {}, "{}"});
             });
  router.add("GET", "/metrics",
             [this](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> ch) {
               handle_metrics(ch);
             });
}

void PrefillServer::handle_prefill(const http::HttpRequest& request,
                                   const std::shared_ptr<http::ResponseChannel>& channel) {
  if (!cluster_token_matches(request, cluster_token_)) {
    channel->send(http::api_error_response(unauthorized("prefill work needs the cluster token")));
    return;
  }
  Result<PrefillWork> work = parse_prefill_work(request.body);
  if (!work.ok()) {
    channel->send(http::api_error_response(api_error_from_status(work.status())));
    return;
  }
  if (!(work->kv_layout == layout_)) {
    channel->send(http::api_error_response(
        invalid_request("the decode node's KV blocks are " + work->kv_layout.to_string() +
                        ", this node's are " + layout_.to_string() +
                        ": run both with the same model, --block-size and --kv-cache-dtype")));
    return;
  }

  auto exchange = std::make_shared<Exchange>();
  exchange->channel = channel;
  InferenceRequest engine_request;
  engine_request.id = "prefill-" + std::to_string(next_id_++) + "-" + work->request_id;
  engine_request.prompt_tokens = std::move(work->prompt_token_ids);
  engine_request.sampling = work->sampling;
  // Only the first token is sampled here, under the request's own rules for it.
  engine_request.sampling.max_tokens = 1;
  engine_request.sampling.min_tokens = std::min(engine_request.sampling.min_tokens, 1);
  KvExportTarget target;
  target.peer_descriptor = std::move(work->kv_descriptor);
  target.peer_num_blocks = work->kv_num_blocks;
  target.peer_blocks = std::move(work->block_ids);
  target.first_block = work->first_block;
  target.transfer_tag = work->transfer_tag;
  target.timeout = std::chrono::milliseconds(work->timeout_ms);
  target.on_finished = [exchange](const KvTransferReport& report) {
    std::lock_guard lock(exchange->mutex);
    if (exchange->token_written) {
      exchange->write_report(report);
    } else {
      exchange->report = report;
    }
  };
  engine_request.kv_export = std::move(target);

  metrics::Counter& tokens_counter =
      metrics_.counter("pdserve:prompt_tokens_total", "Prompt tokens prefilled here.");
  const int prompt_tokens = static_cast<int>(engine_request.prompt_tokens.size());
  auto sink = [exchange, &tokens_counter, prompt_tokens](SequenceDelta delta) {
    std::lock_guard lock(exchange->mutex);
    if (exchange->ended) return;
    if (!delta.error.ok()) {
      PrefillEvent event;
      event.kind = PrefillEvent::Kind::kError;
      event.error = delta.error.message();
      exchange->write(event);
      exchange->end();
      return;
    }
    if (delta.token_ids.empty()) return;
    tokens_counter.inc(prompt_tokens);
    PrefillEvent event;
    event.kind = PrefillEvent::Kind::kFirstToken;
    event.token = delta.token_ids.front();
    if (!delta.logprobs.empty()) {
      event.logprob = delta.logprobs.front().logprob;
      event.top_logprobs = delta.logprobs.front().top;
    }
    event.rng_state = delta.sampler_state.value_or(SamplerRng::State{});
    event.cached_tokens = delta.cached_prompt_tokens;
    const RequestTimings& timings = delta.timings;
    if (timings.first_scheduled) {
      event.queue_ms = milliseconds_between(timings.arrival, *timings.first_scheduled);
      if (timings.first_token) {
        event.compute_ms = milliseconds_between(*timings.first_scheduled, *timings.first_token);
      }
    }
    exchange->write(event);
    exchange->token_written = true;
    if (exchange->report) exchange->write_report(*exchange->report);
  };

  const std::string engine_id = engine_request.id;
  // Held across submit so that the sink cannot write before the stream has started.
  std::lock_guard lock(exchange->mutex);
  const Status submitted = service_.submit(std::move(engine_request), sink);
  if (!submitted.ok()) {
    exchange->ended = true;
    channel->send(http::api_error_response(api_error_from_status(submitted)));
    return;
  }
  metrics_.counter("pdserve:prefill_requests_total", "Prefill work accepted.").inc();
  channel->start_stream(200, "application/x-ndjson", {});
  channel->on_cancel([this, engine_id] { service_.abort(engine_id); });
}

void PrefillServer::handle_metrics(const std::shared_ptr<http::ResponseChannel>& channel) {
  const ServiceStats stats = service_.stats();
  metrics_.gauge("pdserve:num_requests_waiting", "Prefills waiting.").set(stats.num_waiting);
  metrics_.gauge("pdserve:num_requests_running", "Prefills running.").set(stats.num_running);
  metrics_.gauge("pdserve:kv_cache_usage_perc", "Fraction of KV blocks in use.")
      .set(stats.kv_blocks_total == 0
               ? 0.0
               : static_cast<double>(stats.kv_blocks_used) / stats.kv_blocks_total);
  channel->send({200, "text/plain; version=0.0.4", {}, metrics_.render()});
}

}  // namespace pdserve
