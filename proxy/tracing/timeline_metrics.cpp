#include "proxy/tracing/timeline_metrics.h"

#include <algorithm>
#include <string>

namespace pdserve::proxy {
namespace {

// vLLM's TTFT / TPOT ranges, from sub-millisecond gaps to minutes-long prefills.
const std::vector<double> kPhaseBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06,  0.08,
                                           0.1,   0.25,  0.5,  0.75, 1.0,  2.5,   5.0,
                                           7.5,   10.0,  20.0, 40.0, 80.0, 160.0, 640.0};

// A span without a numeric args.index belongs to choice 0 (the proxy's own spans).
bool is_choice_zero(const RequestTimelineSpan& span) {
  const auto index = span.args.find("index");
  if (index == span.args.end()) return true;
  if (const auto* count = std::get_if<int64_t>(&index->second)) return *count == 0;
  if (const auto* number = std::get_if<double>(&index->second)) return *number == 0.0;
  return true;
}

// [first start, last end] of choice 0's spans called `name`.
std::optional<std::pair<double, double>> extent(const std::vector<RequestTimelineSpan>& spans,
                                                std::string_view name) {
  std::optional<std::pair<double, double>> range;
  for (const RequestTimelineSpan& span : spans) {
    if (span.name != name || !is_choice_zero(span)) continue;
    range = range ? std::pair(std::min(range->first, span.start_ms),
                              std::max(range->second, span.end_ms))
                  : std::pair(span.start_ms, span.end_ms);
  }
  return range;
}

std::optional<double> length(const std::optional<std::pair<double, double>>& range) {
  if (!range) return std::nullopt;
  return range->second - range->first;
}

struct HistogramName {
  const char* name;
  const char* help;
};

constexpr HistogramName kTtft = {
    "pdserve:proxy_time_to_first_token_seconds",
    "Proxy arrival to the first token reaching the client (from the timeline)."};
constexpr HistogramName kTpot = {"pdserve:proxy_time_per_output_token_seconds",
                                 "(E2E - TTFT) / (output tokens - 1), as the client saw it."};
constexpr HistogramName kInterToken = {
    "pdserve:proxy_inter_token_latency_seconds",
    "Gap between consecutive output tokens leaving the decode node."};
constexpr HistogramName kPrefillQueue = {
    "pdserve:proxy_prefill_queue_time_seconds",
    "Prefill engine arrival to first scheduled (prefill.queue)."};
constexpr HistogramName kPrefill = {"pdserve:proxy_prefill_time_seconds",
                                    "First prefill chunk start to last prefill chunk end."};
constexpr HistogramName kKvTransfer = {
    "pdserve:proxy_kv_transfer_time_seconds",
    "KV transfer of a remotely prefilled request (first put to acknowledgement)."};
constexpr HistogramName kDecodeQueue = {
    "pdserve:proxy_decode_queue_time_seconds",
    "Decode queue: arrival or KV landed to first scheduled (decode.queue)."};
constexpr HistogramName kTimelineHistograms[] = {kTtft,    kTpot,       kInterToken, kPrefillQueue,
                                                 kPrefill, kKvTransfer, kDecodeQueue};

void observe_ms(metrics::Registry& metrics, const HistogramName& histogram,
                std::optional<double> ms) {
  if (ms) metrics.histogram(histogram.name, histogram.help, kPhaseBuckets).observe(*ms / 1000.0);
}

}  // namespace

TimelineSummary summarize_timeline(const RequestTimeline& aligned) {
  TimelineSummary summary;
  summary.ttft_ms = aligned.ttft_ms;
  summary.tpot_ms = aligned.tpot_ms;
  summary.e2e_ms = aligned.e2e_ms;
  summary.output_tokens = aligned.output_tokens;
  const std::vector<double>& tokens = aligned.tokens_ms;
  for (size_t i = 1; i < tokens.size(); ++i)
    summary.inter_token_ms.push_back(tokens[i] - tokens[i - 1]);
  for (const RequestTimelineSpan& span : aligned.spans) {
    if (span.name != "prefill.chunk" || !is_choice_zero(span)) continue;
    const auto tokens_computed = span.args.find("prompt_tokens");
    if (tokens_computed == span.args.end()) continue;
    if (const auto* count = std::get_if<int64_t>(&tokens_computed->second)) {
      summary.prompt_tokens_computed += *count;
    }
  }
  summary.prefill_queue_ms = length(extent(aligned.spans, "prefill.queue"));
  summary.prefill_compute_ms = length(extent(aligned.spans, "prefill.chunk"));
  summary.decode_queue_ms = length(extent(aligned.spans, "decode.queue"));
  summary.kv_transfer_ms = aligned.kv_transfer ? std::optional(aligned.kv_transfer->ms)
                                               : length(extent(aligned.spans, "kv.transfer"));
  return summary;
}

FinishedRequest finished_request(const TimelineSummary& summary) {
  FinishedRequest request;
  request.ttft_ms = summary.ttft_ms.value_or(0.0);
  request.tpot_ms = summary.tpot_ms.value_or(0.0);
  request.e2e_ms = summary.e2e_ms;
  request.prompt_tokens = static_cast<int>(summary.prompt_tokens_computed);
  request.output_tokens = static_cast<int>(summary.output_tokens);
  request.prefill_queue_ms = summary.prefill_queue_ms.value_or(0.0);
  request.prefill_compute_ms = summary.prefill_compute_ms.value_or(0.0);
  request.kv_transfer_ms = summary.kv_transfer_ms.value_or(0.0);
  request.decode_queue_ms = summary.decode_queue_ms.value_or(0.0);
  request.ok = true;
  return request;
}

void declare_timeline_metrics(metrics::Registry& metrics) {
  for (const HistogramName& histogram : kTimelineHistograms) {
    metrics.histogram(histogram.name, histogram.help, kPhaseBuckets);
  }
}

void observe_timeline(metrics::Registry& metrics, const TimelineSummary& summary) {
  observe_ms(metrics, kTtft, summary.ttft_ms);
  observe_ms(metrics, kTpot, summary.tpot_ms);
  for (double gap : summary.inter_token_ms) observe_ms(metrics, kInterToken, gap);
  observe_ms(metrics, kPrefillQueue, summary.prefill_queue_ms);
  observe_ms(metrics, kPrefill, summary.prefill_compute_ms);
  observe_ms(metrics, kKvTransfer, summary.kv_transfer_ms);
  observe_ms(metrics, kDecodeQueue, summary.decode_queue_ms);
}

}  // namespace pdserve::proxy
