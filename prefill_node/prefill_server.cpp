#include "prefill_node/prefill_server.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "common/cluster/cluster_auth.h"
#include "common/core/log.h"
#include "common/http/api_error_response.h"
#include "common/http/service_routes.h"
#include "common/metrics/vllm_compat.h"
#include "common/protocol/openai_error.h"

namespace pdserve {
namespace {

// pdserve's own phase histograms (seconds), as the decode node's.
const std::vector<double> kPhaseBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,
                                           0.1,   0.25,  0.5,  0.75, 1.0,  2.5,  5.0,
                                           7.5,   10.0,  20.0, 40.0, 80.0, 160.0};

// Cancels remembered for work that has not arrived (yet): enough for any burst of clients that
// leave; the oldest are forgotten first.
constexpr size_t kCancelledEarlyLimit = 4096;

std::string work_key(const std::string& request_id, uint64_t transfer_tag) {
  return request_id + "/" + std::to_string(transfer_tag);
}

// Sent only once no put of the work can land any more.
http::HttpResponse settled_cancel_answer(bool found) {
  return {200, "application/json", {},
          prefill_cancel_answer_to_json({.found = found, .settled = true}).dump()};
}

double milliseconds_between(SteadyTime from, SteadyTime to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// The engine's spans up to the first token, in ms after the receipt of the work.
std::vector<TimelineSpan> prefill_spans(const RequestTimings& timings, SteadyTime receipt) {
  std::vector<TimelineSpan> spans;
  if (timings.first_scheduled) {
    spans.push_back({"prefill.queue",
                     milliseconds_between(receipt, timings.arrival),
                     milliseconds_between(receipt, *timings.first_scheduled),
                     {}});
  }
  for (const PrefillChunkTiming& chunk : timings.prefill_chunks) {
    spans.push_back(
        {"prefill.chunk",
         milliseconds_between(receipt, chunk.start),
         milliseconds_between(receipt, chunk.end),
         {{"prompt_tokens", chunk.prompt_tokens}, {"batch_tokens", chunk.batch_tokens}}});
  }
  return spans;
}

// The transfer's report as the work's event; `at`: when the report arrived (the receiver's
// acknowledgement, as seen here).
PrefillEvent report_event(const KvTransferReport& transfer, SteadyTime receipt, SteadyTime at) {
  PrefillEvent event;
  if (!transfer.status.ok()) {
    event.kind = PrefillEvent::Kind::kKvFailed;
    event.error = transfer.status.message();
    return event;
  }
  event.kind = PrefillEvent::Kind::kKvSent;
  event.bytes = transfer.bytes;
  event.blocks = transfer.blocks;
  event.transfer_ms = transfer.seconds * 1000.0;
  event.layers = transfer.layers;
  event.layers_overlapped = transfer.layers_overlapped;
  event.block_checksums = transfer.block_checksums;
  const double acknowledged_ms = milliseconds_between(receipt, at);
  TimelineSpan transfer_span{"kv.transfer",
                             std::max(0.0, acknowledged_ms - event.transfer_ms),
                             acknowledged_ms,
                             {{"bytes", static_cast<double>(transfer.bytes)},
                              {"blocks", transfer.blocks},
                              {"layers", transfer.layers},
                              {"layers_overlapped", transfer.layers_overlapped}}};
  // Overlapped puts wait for the forward's later layers: their span is not a bandwidth.
  if (transfer.layers_overlapped == 0 && transfer.seconds > 0) {
    transfer_span.args.emplace_back("gb_per_s",
                                    static_cast<double>(transfer.bytes) / transfer.seconds / 1e9);
  }
  event.spans.push_back(std::move(transfer_span));
  // This is the exchange's last event.
  event.spans.push_back({"prefill.request",
                         0.0,
                         milliseconds_between(receipt, std::chrono::steady_clock::now()),
                         {}});
  return event;
}

}  // namespace

// One prefill in flight: its state machine (prefill_exchange_state.h) and what it holds for
// the events it orders.
struct PrefillServer::Exchange {
  std::mutex mutex;  // guards everything below
  PrefillExchangeState state;
  std::shared_ptr<http::ResponseChannel> channel;
  SteadyTime receipt{};  // t = 0 of the spans this node reports
  double head_sent_ms = 0;
  std::optional<KvTransferReport> held_report;  // kKvHeld: arrived before the token
  SteadyTime report_at{};                       // when it arrived
  std::optional<PrefillEvent> held_error;       // kErrorHeld: waits for the export's end
  std::function<void()> on_end;                 // the server forgets the work (for cancel)
  std::string engine_id;                        // the engine's request id, for cancel
  // Cancels of this work, answered when it ends: no put of it can land after its last event.
  std::vector<std::shared_ptr<http::ResponseChannel>> cancel_answers;
  // For the work's log line: the decode node's request id, the first_token event.
  std::string request_id;
  int prompt_tokens = 0;
  std::optional<PrefillEvent> first_token;

  // What came with the event whose actions are carried out.
  struct Payload {
    const PrefillEvent* token = nullptr;
    const PrefillEvent* error = nullptr;
    const KvTransferReport* report = nullptr;
    SteadyTime report_at{};
  };

  // Carries out the state machine's actions for the exchange (the mutex held); the engine's
  // abort and the cancel's answer are the caller's.
  void carry_out(const ExchangeActions& actions, const Payload& payload) {
    if (actions.hold_report) {
      held_report = *payload.report;
      report_at = payload.report_at;
    }
    if (actions.hold_error) held_error = *payload.error;
    if (actions.write_first_token) {
      channel->write(prefill_event_line(*payload.token));
      first_token = *payload.token;
    }
    std::optional<PrefillEvent> last;
    switch (actions.last) {
      case LastEvent::kNone:
        break;
      case LastEvent::kReport:
        last = payload.report != nullptr ? report_event(*payload.report, receipt, payload.report_at)
                                         : report_event(*held_report, receipt, report_at);
        break;
      case LastEvent::kError:
        last = *payload.error;
        break;
      case LastEvent::kHeldError:
        last = *held_error;
        break;
    }
    if (last) channel->write(prefill_event_line(*last));
    if (actions.finish_work) {
      if (on_end) std::exchange(on_end, nullptr)();
      for (const auto& answer : std::exchange(cancel_answers, {})) {
        answer->send(settled_cancel_answer(/*found=*/true));
      }
    }
    if (last) {
      channel->end_stream();
      channel.reset();
      log_finished(*last);
    }
  }
  // One line per work, as the decode node logs one per request (under the same request id).
  void log_finished(const PrefillEvent& last) const {
    const auto ms = [](double value) { return std::to_string(std::llround(value)) + " ms"; };
    std::string line = "request " + request_id + " finished (" + prefill_event_name(last.kind) +
                       "): prompt " + std::to_string(prompt_tokens) + " tokens";
    if (first_token) {
      line += " (" + std::to_string(first_token->cached_tokens) + " cached), queue " +
              ms(first_token->queue_ms) + ", prefill " + ms(first_token->compute_ms);
    }
    if (last.kind == PrefillEvent::Kind::kKvSent) {
      line +=
          ", KV transfer " + ms(last.transfer_ms) + ", " + std::to_string(last.bytes) + " bytes";
    } else {
      line += ": " + last.error;
    }
    PDS_LOG_INFO(line);
  }
};

PrefillServer::PrefillServer(InferenceService& service, KvBlockLayout layout,
                             std::string cluster_token, std::function<bool()> draining,
                             std::unique_ptr<kv_transfer::KvPeerAllowlist> kv_peers)
    : service_(service),
      layout_(std::move(layout)),
      cluster_token_(std::move(cluster_token)),
      draining_(std::move(draining)),
      // Counters start at the engine's totals now: the warm-up is not traffic.
      engine_metrics_(metrics_, service.model_info().name, NodeRole::kPrefill, service.stats()),
      requests_(metrics_.counter("pdserve:prefill_requests_total", "Prefill work accepted.")),
      cancels_(metrics_.counter("pdserve:prefill_cancels_total",
                                "Prefill work cancelled by decode nodes.")),
      prompt_tokens_(metrics_.counter("pdserve:prefill_prompt_tokens_total",
                                      "Prompt tokens of the work that produced a first token.")),
      queue_time_(metrics_.histogram("pdserve:prefill_queue_time_seconds",
                                     "Prefill work arrival to first scheduled.", kPhaseBuckets)),
      // vLLM's name: the decode node counts only the prompts it prefills itself, so a sum over
      // all nodes has every request's prefill once.
      prefill_time_(metrics_.histogram("vllm:request_prefill_time_seconds",
                                       "Histogram of time spent in PREFILL phase for request.",
                                       metrics::vllm_request_latency_buckets(),
                                       metrics::vllm_labels(service.model_info().name))),
      transfer_time_(metrics_.histogram(
          "pdserve:kv_transfer_time_seconds",
          "KV transfer of a prefilled prompt, first put to the receiver's acknowledgement.",
          kPhaseBuckets)),
      transfer_bytes_(
          metrics_.counter("pdserve:kv_transfer_bytes_total", "KV bytes sent to decode nodes.")),
      descriptor_refused_(metrics_.counter(
          "pdserve:kv_descriptor_refused_total",
          "KV transfers refused before any put: the work's KV descriptor was unreadable, named "
          "a UCX worker that is no registered decode node's, was denied by the decode node's "
          "handshake, or named blocks outside its pool.")),
      layout_refused_(metrics_.counter(
          "pdserve:kv_layout_refused_total",
          "Prefill work refused because the decode node's KV blocks have another layout: "
          "layers, block size, KV heads, head size, KV dtype (--kv-cache-dtype) or FP8 scales.")),
      kv_peers_(std::move(kv_peers)) {}

void PrefillServer::register_routes(http::RouteTable& router) {
  router.add("POST", "/internal/v1/prefill",
             [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
               handle_prefill(request, ch);
             });
  router.add("POST", "/internal/v1/prefill/cancel",
             [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
               handle_cancel(request, ch);
             });
  // The port opens only once the model is loaded and the engine runs: serving is ready.
  http::add_service_routes(router, {});
  router.add("GET", "/metrics",
             [this](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> ch) {
               handle_metrics(ch);
             });
}

void PrefillServer::handle_prefill(const http::HttpRequest& request,
                                   const std::shared_ptr<http::ResponseChannel>& channel) {
  const SteadyTime receipt = std::chrono::steady_clock::now();
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
    layout_refused_.inc();
    ApiError error = invalid_request(
        "the decode node's KV blocks are " + work->kv_layout.to_string() + ", this node's are " +
        layout_.to_string() + ": run both with the same model, --block-size and --kv-cache-dtype");
    error.code = "kv_layout_mismatch";
    channel->send(http::api_error_response(error));
    return;
  }
  if (kv_peers_ == nullptr) {
    admit(std::move(*work), receipt, channel);
    return;
  }
  // No address from a request reaches UCX unless a registered decode node's (issue #34).
  const std::string descriptor = work->kv_descriptor;
  auto checked = std::make_shared<PrefillWork>(std::move(*work));
  kv_peers_->check(descriptor, [this, checked, receipt, channel](const Status& verdict) {
    channel->post([this, checked, receipt, channel, verdict] {
      if (verdict.ok()) {
        admit(std::move(*checked), receipt, channel);
        return;
      }
      descriptor_refused_.inc();
      PDS_LOG_WARN("request " + checked->request_id + ": work refused: " + verdict.message());
      ApiError error = api_error_from_status(verdict);
      if (verdict.code() == StatusCode::kPermissionDenied) {
        error.http_status = 403;  // the token was fine: the KV destination is not allowed
        error.code = "kv_peer_not_registered";
      }
      channel->send(http::api_error_response(error));
    });
  });
}

void PrefillServer::admit(PrefillWork work, SteadyTime receipt,
                          const std::shared_ptr<http::ResponseChannel>& channel) {
  const std::string key = work_key(work.request_id, work.transfer_tag);
  auto exchange = std::make_shared<Exchange>();
  exchange->channel = channel;
  exchange->receipt = receipt;
  exchange->request_id = work.request_id;
  exchange->prompt_tokens = static_cast<int>(work.prompt_token_ids.size());
  InferenceRequest engine_request;
  engine_request.id = "prefill-" + std::to_string(next_id_++) + "-" + work.request_id;
  engine_request.prompt_tokens = std::move(work.prompt_token_ids);
  engine_request.sampling = work.sampling;
  // Only the first token is sampled here, under the request's own rules for it.
  engine_request.sampling.max_tokens = 1;
  engine_request.sampling.min_tokens = std::min(engine_request.sampling.min_tokens, 1);
  KvExportTarget target;
  target.peer_descriptor = std::move(work.kv_descriptor);
  target.peer_num_blocks = work.kv_num_blocks;
  target.peer_blocks = std::move(work.block_ids);
  target.first_block = work.first_block;
  target.transfer_tag = work.transfer_tag;
  target.timeout = std::chrono::milliseconds(work.timeout_ms);
  target.checksum = work.kv_checksum;
  metrics::Histogram& transfer_time = transfer_time_;
  metrics::Counter& transfer_bytes = transfer_bytes_;
  metrics::Counter& descriptor_refused = descriptor_refused_;
  target.on_finished = [exchange, &transfer_time, &transfer_bytes,
                        &descriptor_refused](const KvTransferReport& report) {
    const SteadyTime at = std::chrono::steady_clock::now();
    if (report.status.ok()) {
      transfer_time.observe(report.seconds);
      transfer_bytes.inc(static_cast<double>(report.bytes));
    }
    if (report.refused) descriptor_refused.inc();
    std::lock_guard lock(exchange->mutex);
    exchange->carry_out(exchange->state.kv_reported(), {.report = &report, .report_at = at});
  };
  target.on_started = [exchange] {
    std::lock_guard lock(exchange->mutex);
    exchange->carry_out(exchange->state.export_started(), {});
  };
  engine_request.kv_export = std::move(target);

  metrics::Counter& tokens_counter = prompt_tokens_;
  metrics::Histogram& queue_time = queue_time_;
  metrics::Histogram& prefill_time = prefill_time_;
  const int prompt_tokens = static_cast<int>(engine_request.prompt_tokens.size());
  const bool wants_prompt_logprobs = engine_request.sampling.prompt_logprobs.has_value();
  auto handle_delta = [exchange, &tokens_counter, &queue_time, &prefill_time, prompt_tokens,
                       wants_prompt_logprobs](SequenceDelta delta) {
    std::lock_guard lock(exchange->mutex);
    if (exchange->state.ended()) return;
    if (!delta.error.ok()) {
      PrefillEvent event;
      event.kind = PrefillEvent::Kind::kError;
      event.error = delta.error.message();
      exchange->carry_out(exchange->state.prefill_failed(), {.error = &event});
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
    if (wants_prompt_logprobs) event.prompt_logprobs = std::move(delta.prompt_logprobs);
    event.rng_state = delta.sampler_state.value_or(SamplerRng::State{});
    event.cached_tokens = delta.cached_prompt_tokens;
    const RequestTimings& timings = delta.timings;
    if (timings.first_scheduled) {
      event.queue_ms = milliseconds_between(timings.arrival, *timings.first_scheduled);
      queue_time.observe(event.queue_ms / 1000.0);
      if (timings.first_token) {
        event.compute_ms = milliseconds_between(*timings.first_scheduled, *timings.first_token);
        prefill_time.observe(event.compute_ms / 1000.0);
      }
    }
    event.head_sent_ms = exchange->head_sent_ms;
    event.spans = prefill_spans(timings, exchange->receipt);
    exchange->carry_out(exchange->state.first_token(), {.token = &event});
  };

  // The engine thread only hands the delta over; the event is built on the connection's strand.
  auto sink = [strand = channel, handle_delta, exchange,
               hook = test_after_delta_](SequenceDelta delta) {
    strand->post([handle_delta, exchange, hook, delta = std::move(delta)]() mutable {
      const std::string engine_request_id = delta.request_id;
      handle_delta(std::move(delta));
      if (!hook) return;
      bool ended = false;
      {
        std::lock_guard lock(exchange->mutex);
        ended = exchange->state.ended();
      }
      hook(engine_request_id, ended);
    });
  };

  const std::string engine_id = engine_request.id;
  exchange->engine_id = engine_id;
  // Held across submit so that the sink cannot write before the stream has started, and a
  // cancel that finds the work waits until it was submitted (or refused).
  std::lock_guard lock(exchange->mutex);
  {
    std::lock_guard work_lock(work_mutex_);
    if (cancelled_early_.contains(key)) {
      exchange->carry_out(exchange->state.cancelled_before_arrival(), {});
      channel->send(http::api_error_response(api_error_from_status(cancelled(
          "request '" + exchange->request_id + "' was cancelled before its work arrived"))));
      return;
    }
    work_in_flight_[key] = exchange;
  }
  exchange->on_end = [this, key] { forget_work(key); };
  const Status submitted = service_.submit(std::move(engine_request), sink);
  if (!submitted.ok()) {
    exchange->carry_out(exchange->state.submit_failed(), {});
    channel->send(http::api_error_response(api_error_from_status(submitted)));
    return;
  }
  exchange->carry_out(exchange->state.admitted(), {});
  requests_.inc();
  channel->start_stream(200, "application/x-ndjson", {});
  exchange->head_sent_ms = milliseconds_between(receipt, std::chrono::steady_clock::now());
  // May run at once, with the exchange's mutex held here: client_gone() needs no lock.
  channel->on_cancel([this, engine_id] {
    if (PrefillExchangeState::client_gone().abort_engine) service_.abort(engine_id);
  });
}

void PrefillServer::forget_work(const std::string& key) {
  std::lock_guard lock(work_mutex_);
  work_in_flight_.erase(key);
}

void PrefillServer::handle_cancel(const http::HttpRequest& request,
                                  const std::shared_ptr<http::ResponseChannel>& channel) {
  if (!cluster_token_matches(request, cluster_token_)) {
    channel->send(http::api_error_response(unauthorized("prefill cancel needs the cluster token")));
    return;
  }
  Result<PrefillCancel> cancel = parse_prefill_cancel(request.body);
  if (!cancel.ok()) {
    channel->send(http::api_error_response(api_error_from_status(cancel.status())));
    return;
  }
  const std::string key = work_key(cancel->request_id, cancel->transfer_tag);
  std::shared_ptr<Exchange> exchange;
  {
    std::lock_guard lock(work_mutex_);
    if (auto it = work_in_flight_.find(key); it != work_in_flight_.end()) {
      exchange = it->second;
    } else if (cancelled_early_.insert(key).second) {
      // Not here (yet, or any more): refuse the work should it still arrive.
      cancelled_early_order_.push_back(key);
      if (cancelled_early_order_.size() > kCancelledEarlyLimit) {
        cancelled_early_.erase(cancelled_early_order_.front());
        cancelled_early_order_.pop_front();
      }
    }
  }
  cancels_.inc();
  if (!exchange) {
    // Not here: never ran, or ended; refused should it still arrive. No put can land.
    channel->send(settled_cancel_answer(/*found=*/false));
    return;
  }
  ExchangeActions actions;
  {
    std::lock_guard lock(exchange->mutex);
    actions = exchange->state.cancel();
    if (actions.keep_cancel) exchange->cancel_answers.push_back(channel);
  }
  if (actions.answer_cancel) channel->send(settled_cancel_answer(/*found=*/true));
  if (actions.abort_engine) service_.abort(exchange->engine_id);
}

void PrefillServer::handle_metrics(const std::shared_ptr<http::ResponseChannel>& channel) {
  engine_metrics_.publish(service_.stats(), draining_());
  channel->send({200, "text/plain; version=0.0.4", {}, metrics_.render()});
}

}  // namespace pdserve
