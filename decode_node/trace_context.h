// W3C trace context (https://www.w3.org/TR/trace-context/) on the decode node: the request's
// `traceparent` when it carries a valid one, else a fresh trace; the child traceparent sent
// with the PrefillWork to the prefill node names this node's own span in that trace.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace pdserve {

struct TraceContext {
  std::string trace_id;  // 32 lowercase hex digits, not all zero
  std::string span_id;   // 16 lowercase hex digits, not all zero: this node's span
};

// The trace id and parent span id of a valid version-00 `traceparent` header
// (00-<32 hex>-<16 hex>-<2 hex>, lowercase, ids not all zero); nullopt otherwise.
std::optional<TraceContext> parse_traceparent(std::string_view header);

// Continues the header's trace with a new span of this node, or starts a new trace when the
// header is absent or invalid.
TraceContext continue_or_start_trace(std::optional<std::string_view> header);

// "00-<trace_id>-<span_id>-01" (sampled).
std::string traceparent_header(const TraceContext& context);

}  // namespace pdserve
