#include "serving/openai/request_metrics.h"

#include <chrono>
#include <string>
#include <vector>

#include "common/core/log.h"
#include "common/metrics/vllm_compat.h"

namespace pdserve {
namespace {

// pdserve's own phase histograms (seconds): finer than vLLM's request buckets at the low end,
// where a KV transfer or a remote prefill of a short prompt lies.
const std::vector<double> kPhaseBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,
                                           0.1,   0.25,  0.5,  0.75, 1.0,  2.5,  5.0,
                                           7.5,   10.0,  20.0, 40.0, 80.0, 160.0};

double seconds_between(SteadyTime from, SteadyTime to) {
  return std::chrono::duration<double>(to - from).count();
}

// One log line per finished choice: its id, token counts, TTFT, TPOT and end-to-end time.
void log_finished(const SequenceDelta& delta, std::optional<double> ttft_seconds,
                  std::optional<double> tpot_seconds, double e2e_seconds) {
  const auto ms = [](std::optional<double> seconds) {
    return seconds ? std::to_string(static_cast<int64_t>(*seconds * 1000.0)) + " ms"
                   : std::string("-");
  };
  PDS_LOG_INFO("request " + delta.request_id + " finished (" +
               std::string(finish_reason_name(delta.finish_reason)) + "): prompt " +
               std::to_string(delta.prompt_tokens) + " tokens, output " +
               std::to_string(delta.completion_tokens) + " tokens, TTFT " + ms(ttft_seconds) +
               ", TPOT " + ms(tpot_seconds) + ", e2e " + ms(e2e_seconds));
}

}  // namespace

RequestMetrics::RequestMetrics(metrics::Registry& registry, const ModelInfo& model)
    : registry_(registry) {
  const metrics::Labels labels = metrics::vllm_labels(model.name);
  const auto histogram = [&registry](const char* name, const char* help,
                                     const std::vector<double>& buckets,
                                     const metrics::Labels& with) {
    return &registry.histogram(name, help, buckets, with);
  };
  const auto& request_buckets = metrics::vllm_request_latency_buckets();
  const auto& token_buckets = metrics::vllm_token_latency_buckets();
  const std::vector<double> length_buckets = metrics::vllm_1_2_5_buckets(model.max_model_len);
  ttft_ =
      histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                metrics::vllm_ttft_buckets(), labels);
  inter_token_ = histogram("vllm:inter_token_latency_seconds",
                           "Histogram of inter-token latency in seconds.", token_buckets, labels);
  inter_token_deprecated_ =
      histogram("vllm:time_per_output_token_seconds",
                "Histogram of time per output token in seconds. DEPRECATED in vLLM 0.11: the same "
                "observations as vllm:inter_token_latency_seconds.",
                token_buckets, labels);
  request_tpot_ =
      histogram("vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.", token_buckets, labels);
  e2e_ = histogram("vllm:e2e_request_latency_seconds",
                   "Histogram of e2e request latency in seconds.", request_buckets, labels);
  queue_ =
      histogram("vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.", request_buckets, labels);
  prefill_ = histogram("vllm:request_prefill_time_seconds",
                       "Histogram of time spent in PREFILL phase for request (prefilled here).",
                       request_buckets, labels);
  decode_ =
      histogram("vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.", request_buckets, labels);
  inference_ =
      histogram("vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.", request_buckets, labels);
  prompt_tokens_ = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                             length_buckets, labels);
  generation_tokens_ = histogram("vllm:request_generation_tokens",
                                 "Number of generation tokens processed.", length_buckets, labels);
  for (const FinishReason reason : kFinishReasons) {
    metrics::Labels with_reason = labels;
    with_reason.emplace_back("finished_reason", std::string(finish_reason_name(reason)));
    success_[static_cast<size_t>(reason)] = &registry.counter(
        "vllm:request_success_total", "Count of successfully processed requests.", with_reason);
  }
  remote_prefill_ = histogram("pdserve:remote_prefill_time_seconds",
                              "Prefill work posted to a prefill node to its first token received.",
                              kPhaseBuckets, {});
  kv_wait_ = histogram("pdserve:kv_wait_time_seconds",
                       "First token received from the prefill node to its KV landed here.",
                       kPhaseBuckets, {});
  kv_transfer_ =
      histogram("pdserve:kv_transfer_time_seconds",
                "KV transfer as the prefill node measured it (first put to acknowledgement).",
                kPhaseBuckets, {});
  kv_transfer_bytes_ =
      &registry.counter("pdserve:kv_transfer_bytes_total", "KV bytes received from prefill nodes.");
}

void RequestMetrics::count_response(int http_status) {
  registry_
      .counter("pdserve:http_requests_total", "HTTP responses by status code.",
               {{"status", std::to_string(http_status)}})
      .inc();
}

void RequestMetrics::record_finished(const SequenceDelta& delta) {
  if (metrics::Counter* success = success_[static_cast<size_t>(delta.finish_reason)]) {
    success->inc();
  }
  const RequestTimings& timings = delta.timings;
  if (timings.first_scheduled) {
    queue_->observe(seconds_between(timings.arrival, *timings.first_scheduled));
  }
  if (timings.first_token) {
    ttft_->observe(seconds_between(timings.arrival, *timings.first_token));
  }
  if (!timings.finished) return;
  record_phases(delta);
  prompt_tokens_->observe(static_cast<double>(delta.prompt_tokens));
  generation_tokens_->observe(static_cast<double>(delta.completion_tokens));
  const double e2e = seconds_between(timings.arrival, *timings.finished);
  e2e_->observe(e2e);
  std::optional<double> ttft;
  std::optional<double> tpot;
  if (timings.first_token) ttft = seconds_between(timings.arrival, *timings.first_token);
  if (ttft && delta.completion_tokens > 1) {
    tpot = (e2e - *ttft) / (delta.completion_tokens - 1);
    request_tpot_->observe(*tpot);
  }
  log_finished(delta, ttft, tpot, e2e);
}

void RequestMetrics::record_phases(const SequenceDelta& delta) {
  const RequestTimings& timings = delta.timings;
  // Where the work on the prompt started: the prefill work's POST, or the local schedule.
  std::optional<SteadyTime> inference_start = timings.first_scheduled;
  if (delta.remote_prefill && delta.remote_prefill->work_posted != SteadyTime{}) {
    const RemotePrefillStats& remote = *delta.remote_prefill;
    inference_start = remote.work_posted;
    remote_prefill_->observe(seconds_between(remote.work_posted, remote.first_token_received));
    // A request ended by its first token does not wait for its KV.
    if (timings.kv_ready) {
      kv_wait_->observe(seconds_between(remote.first_token_received, *timings.kv_ready));
      kv_transfer_->observe(remote.transfer_seconds);
      kv_transfer_bytes_->inc(static_cast<double>(remote.transfer_bytes));
    }
  } else if (timings.first_scheduled && timings.first_token) {
    // A remote prefill is counted by the prefill node that did it, so that a sum over all
    // nodes counts every request's prefill once.
    prefill_->observe(seconds_between(*timings.first_scheduled, *timings.first_token));
  }
  if (timings.first_token) {
    decode_->observe(seconds_between(*timings.first_token, *timings.finished));
  }
  if (inference_start) {
    inference_->observe(seconds_between(*inference_start, *timings.finished));
  }
}

void RequestMetrics::record_inter_token_latency(double seconds) {
  inter_token_->observe(seconds);
  inter_token_deprecated_->observe(seconds);
}

}  // namespace pdserve
