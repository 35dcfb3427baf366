// OpenTelemetry traces of finished requests, as OTLP/HTTP JSON (opentelemetry-proto's
// ExportTraceServiceRequest in the protobuf JSON mapping: ids as lowercase hex, times as unix
// nanoseconds in strings). One request's aligned timeline becomes one span tree: the proxy's
// root span (its id is the span id the proxy forwarded in traceparent, its parent the client's
// span when the client sent a traceparent) with the timeline's spans beneath it
// (docs/TRACING.md, "OpenTelemetry").
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/core/status.h"
#include "common/http/http_client.h"
#include "common/protocol/request_timeline.h"

namespace pdserve::proxy {

inline constexpr std::string_view kOtlpTracesPath = "/v1/traces";

// Where the batches are POSTed.
struct OtlpEndpoint {
  http::BaseUrl base;
  std::string path;  // "/v1/traces" unless the URL named another
};

// http://HOST[:PORT][/PATH]: the path as given, or /v1/traces when it is empty or "/" (a base
// URL, as OTEL_EXPORTER_OTLP_ENDPOINT). InvalidArgument for another scheme (https is not
// supported) or a malformed URL.
Result<OtlpEndpoint> parse_otlp_traces_endpoint(std::string_view url);

// What the proxy knows of a finished request besides its aligned timeline.
struct OtlpRequestInfo {
  std::string root_span_id;     // the proxy's span id (sent to the decode node in traceparent)
  std::string client_span_id;   // the client's traceparent parent id; empty without one
  int64_t arrival_unix_ns = 0;  // the proxy's arrival on the wall clock: the timeline's t = 0
  std::optional<int64_t> prompt_tokens;      // the response's usage, when it carried one
  std::optional<int64_t> completion_tokens;  // likewise; else the timeline's output_tokens
};

// The request's spans (OTLP JSON Span objects), root first. `new_span_id` gives a fresh
// 16-hex-digit id for each span below the root. Parents: proxy.route and decode.request under
// the root; prefill.queue, prefill.chunk and kv.transfer under prefill.request (under
// decode.request when the decode node prefilled); every other span under decode.request (of
// the same args.index when several choices ran), else the root.
std::vector<nlohmann::json> otlp_request_spans(const RequestTimeline& aligned,
                                               const OtlpRequestInfo& info,
                                               const std::function<std::string()>& new_span_id);

// The ExportTraceServiceRequest body for `spans`, with resource attribute service.name.
nlohmann::json otlp_export_request(std::string_view service_name,
                                   const std::vector<nlohmann::json>& spans);

}  // namespace pdserve::proxy
