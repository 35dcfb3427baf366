#include "proxy/timeline_metrics.h"

#include <algorithm>
#include <string>

namespace pdserve::proxy {
namespace {

using Json = nlohmann::json;

// vLLM's TTFT / TPOT ranges, from sub-millisecond gaps to minutes-long prefills.
const std::vector<double> kPhaseBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06,  0.08,
                                           0.1,   0.25,  0.5,  0.75, 1.0,  2.5,   5.0,
                                           7.5,   10.0,  20.0, 40.0, 80.0, 160.0, 640.0};

std::optional<double> number_or_null(const Json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

bool is_choice_zero(const Json& span) {
  const auto args = span.find("args");
  if (args == span.end() || !args->is_object()) return true;
  const auto index = args->find("index");
  return index == args->end() || !index->is_number() || index->get<double>() == 0.0;
}

// [first start, last end] of choice 0's spans called `name`.
std::optional<std::pair<double, double>> extent(const Json& spans, std::string_view name) {
  std::optional<std::pair<double, double>> range;
  for (const Json& span : spans) {
    if (span.value("name", "") != name || !is_choice_zero(span)) continue;
    const double start = span.value("start_ms", 0.0);
    const double end = span.value("end_ms", 0.0);
    range = range ? std::pair(std::min(range->first, start), std::max(range->second, end))
                  : std::pair(start, end);
  }
  return range;
}

std::optional<double> length(const std::optional<std::pair<double, double>>& range) {
  if (!range) return std::nullopt;
  return range->second - range->first;
}

void observe_ms(metrics::Registry& metrics, const std::string& name, const std::string& help,
                std::optional<double> ms) {
  if (ms) metrics.histogram(name, help, kPhaseBuckets).observe(*ms / 1000.0);
}

}  // namespace

TimelineSummary summarize_timeline(const Json& aligned) {
  TimelineSummary summary;
  summary.ttft_ms = number_or_null(aligned, "ttft_ms");
  summary.tpot_ms = number_or_null(aligned, "tpot_ms");
  summary.e2e_ms = number_or_null(aligned, "e2e_ms").value_or(0.0);
  summary.output_tokens = aligned.value("output_tokens", int64_t{0});
  if (const auto tokens = aligned.find("tokens_ms");
      tokens != aligned.end() && tokens->is_array()) {
    for (size_t i = 1; i < tokens->size(); ++i) {
      summary.inter_token_ms.push_back((*tokens)[i].get<double>() - (*tokens)[i - 1].get<double>());
    }
  }
  const Json& spans = aligned.at("spans");
  for (const Json& span : spans) {
    if (span.value("name", "") != "prefill.chunk" || !is_choice_zero(span)) continue;
    const auto args = span.find("args");
    if (args == span.end() || !args->is_object()) continue;
    const auto tokens = args->find("prompt_tokens");
    if (tokens != args->end() && tokens->is_number_integer()) {
      summary.prompt_tokens_computed += tokens->get<int64_t>();
    }
  }
  summary.prefill_queue_ms = length(extent(spans, "prefill.queue"));
  summary.prefill_compute_ms = length(extent(spans, "prefill.chunk"));
  summary.decode_queue_ms = length(extent(spans, "decode.queue"));
  const auto kv = aligned.find("kv_transfer");
  summary.kv_transfer_ms = kv != aligned.end() && kv->is_object()
                               ? number_or_null(*kv, "ms")
                               : length(extent(spans, "kv.transfer"));
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

void observe_timeline(metrics::Registry& metrics, const TimelineSummary& summary) {
  observe_ms(metrics, "pdserve:proxy_time_to_first_token_seconds",
             "Proxy arrival to the first token reaching the client (from the timeline).",
             summary.ttft_ms);
  observe_ms(metrics, "pdserve:proxy_time_per_output_token_seconds",
             "(E2E - TTFT) / (output tokens - 1), as the client saw it.", summary.tpot_ms);
  for (double gap : summary.inter_token_ms) {
    observe_ms(metrics, "pdserve:proxy_inter_token_latency_seconds",
               "Gap between consecutive output tokens leaving the decode node.", gap);
  }
  observe_ms(metrics, "pdserve:proxy_prefill_queue_time_seconds",
             "Prefill engine arrival to first scheduled (prefill.queue).",
             summary.prefill_queue_ms);
  observe_ms(metrics, "pdserve:proxy_prefill_time_seconds",
             "First prefill chunk start to last prefill chunk end.", summary.prefill_compute_ms);
  observe_ms(metrics, "pdserve:proxy_kv_transfer_time_seconds",
             "KV transfer of a remotely prefilled request (first put to acknowledgement).",
             summary.kv_transfer_ms);
  observe_ms(metrics, "pdserve:proxy_decode_queue_time_seconds",
             "Decode queue: arrival or KV landed to first scheduled (decode.queue).",
             summary.decode_queue_ms);
}

}  // namespace pdserve::proxy
