#include "proxy/tracing/otlp_trace.h"

#include <algorithm>
#include <cmath>

namespace pdserve::proxy {
namespace {

using Json = nlohmann::json;

// OTLP Span.SpanKind.
constexpr int kSpanKindInternal = 1;
constexpr int kSpanKindServer = 2;

Json attribute(std::string_view key, const TimelineArgValue& value) {
  Json any;
  if (const auto* count = std::get_if<int64_t>(&value)) {
    any["intValue"] = std::to_string(*count);  // int64 is a string in the JSON mapping
  } else if (const auto* number = std::get_if<double>(&value)) {
    any["doubleValue"] = *number;
  } else {
    any["stringValue"] = std::get<std::string>(value);
  }
  return {{"key", key}, {"value", std::move(any)}};
}

std::string unix_ns(const OtlpRequestInfo& info, double ms) {
  return std::to_string(info.arrival_unix_ns + std::llround(ms * 1e6));
}

Json span_json(const RequestTimelineSpan& span, const OtlpRequestInfo& info,
               const std::string& trace_id, const std::string& span_id,
               const std::string& parent_id, int kind) {
  Json attributes = Json::array();
  attributes.push_back(attribute("pdserve.node", span.node));
  for (const auto& [key, value] : span.args) {
    attributes.push_back(attribute("pdserve." + key, value));
  }
  Json out = {{"traceId", trace_id},
              {"spanId", span_id},
              {"name", span.name},
              {"kind", kind},
              {"startTimeUnixNano", unix_ns(info, span.start_ms)},
              {"endTimeUnixNano", unix_ns(info, span.end_ms)},
              {"attributes", std::move(attributes)}};
  if (!parent_id.empty()) out["parentSpanId"] = parent_id;
  return out;
}

std::optional<int64_t> choice_index(const RequestTimelineSpan& span) {
  const auto found = span.args.find("index");
  if (found == span.args.end()) return std::nullopt;
  const auto* index = std::get_if<int64_t>(&found->second);
  return index ? std::optional<int64_t>(*index) : std::nullopt;
}

// The vLLM-style request attributes of the root span (vllm/tracing.py SpanAttributes).
void add_request_attributes(const RequestTimeline& timeline, const OtlpRequestInfo& info,
                            Json& attributes) {
  attributes.push_back(attribute("gen_ai.request.id", timeline.request_id));
  if (info.prompt_tokens) {
    attributes.push_back(attribute("gen_ai.usage.prompt_tokens", *info.prompt_tokens));
  }
  attributes.push_back(attribute("gen_ai.usage.completion_tokens",
                                 info.completion_tokens.value_or(timeline.output_tokens)));
  if (timeline.ttft_ms) {
    attributes.push_back(attribute("gen_ai.latency.time_to_first_token", *timeline.ttft_ms / 1e3));
  }
  attributes.push_back(attribute("gen_ai.latency.e2e", timeline.e2e_ms / 1e3));
  std::optional<double> queue_ms, prefill_start_ms, prefill_end_ms, decode_ms;
  for (const RequestTimelineSpan& span : timeline.spans) {
    if (choice_index(span).value_or(0) != 0) continue;  // choice 0, as the histograms
    const double ms = span.end_ms - span.start_ms;
    if (span.name == "prefill.queue" || span.name == "decode.queue") {
      queue_ms = queue_ms.value_or(0.0) + ms;
    } else if (span.name == "prefill.chunk") {
      prefill_start_ms = std::min(prefill_start_ms.value_or(span.start_ms), span.start_ms);
      prefill_end_ms = std::max(prefill_end_ms.value_or(span.end_ms), span.end_ms);
    } else if (span.name == "decode.steps") {
      decode_ms = ms;
    }
  }
  if (queue_ms) attributes.push_back(attribute("gen_ai.latency.time_in_queue", *queue_ms / 1e3));
  if (prefill_start_ms) {
    attributes.push_back(attribute("gen_ai.latency.time_in_model_prefill",
                                   (*prefill_end_ms - *prefill_start_ms) / 1e3));
  }
  if (decode_ms) {
    attributes.push_back(attribute("gen_ai.latency.time_in_model_decode", *decode_ms / 1e3));
  }
}

}  // namespace

Result<OtlpEndpoint> parse_otlp_traces_endpoint(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  if (!url.starts_with(kScheme)) {
    return invalid_argument("OTLP traces endpoint '" + std::string(url) +
                            "' must start with http:// (https is not supported)");
  }
  const size_t path_at = url.find('/', kScheme.size());
  OtlpEndpoint endpoint;
  PDS_ASSIGN_OR_RETURN(endpoint.base, http::parse_base_url(url.substr(0, path_at)));
  const std::string_view path =
      path_at == std::string_view::npos ? std::string_view() : url.substr(path_at);
  endpoint.path = path.empty() || path == "/" ? std::string(kOtlpTracesPath) : std::string(path);
  return endpoint;
}

std::vector<Json> otlp_request_spans(const RequestTimeline& aligned, const OtlpRequestInfo& info,
                                     const std::function<std::string()>& new_span_id) {
  std::vector<std::string> ids(aligned.spans.size());
  std::optional<size_t> root;
  for (size_t i = 0; i < aligned.spans.size(); ++i) {
    if (!root && aligned.spans[i].name == "proxy.request") {
      root = i;
      ids[i] = info.root_span_id;
    } else {
      ids[i] = new_span_id();
    }
  }
  // The id of the first span named `name` of the same choice as `span`.
  const auto find_span = [&](std::string_view name,
                             const RequestTimelineSpan& span) -> std::optional<std::string> {
    for (size_t i = 0; i < aligned.spans.size(); ++i) {
      const RequestTimelineSpan& candidate = aligned.spans[i];
      if (candidate.name != name) continue;
      const std::optional<int64_t> index = choice_index(span);
      if (!index || choice_index(candidate).value_or(*index) == *index) return ids[i];
    }
    return std::nullopt;
  };

  std::vector<Json> spans;
  spans.reserve(aligned.spans.size() + 1);
  if (root) {
    spans.push_back(span_json(aligned.spans[*root], info, aligned.trace_id, info.root_span_id,
                              info.client_span_id, kSpanKindServer));
  } else {  // a timeline the proxy did not align: a root from arrival to the end
    spans.push_back(span_json({"proxy.request", "proxy", 0.0, aligned.e2e_ms, {}}, info,
                              aligned.trace_id, info.root_span_id, info.client_span_id,
                              kSpanKindServer));
  }
  add_request_attributes(aligned, info, spans.front()["attributes"]);

  for (size_t i = 0; i < aligned.spans.size(); ++i) {
    if (root && i == *root) continue;
    const RequestTimelineSpan& span = aligned.spans[i];
    std::optional<std::string> parent;
    if (span.name == "prefill.queue" || span.name == "prefill.chunk" ||
        span.name == "kv.transfer") {
      parent = find_span("prefill.request", span);
      if (!parent) parent = find_span("decode.request", span);
    } else if (!span.name.starts_with("proxy.") && span.name != "decode.request") {
      parent = find_span("decode.request", span);
    }
    spans.push_back(span_json(span, info, aligned.trace_id, ids[i],
                              parent.value_or(info.root_span_id), kSpanKindInternal));
  }
  return spans;
}

Json otlp_export_request(std::string_view service_name, const std::vector<Json>& spans) {
  Json resource = {
      {"attributes", Json::array({attribute("service.name", std::string(service_name))})}};
  Json scope = {{"scope", {{"name", "pdserve.proxy"}}}, {"spans", spans}};
  return {{"resourceSpans", Json::array({{{"resource", std::move(resource)},
                                          {"scopeSpans", Json::array({std::move(scope)})}}})}};
}

}  // namespace pdserve::proxy
