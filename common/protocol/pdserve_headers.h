// The HTTP header names pdserve's processes send each other and accept from clients, in one
// place.
#pragma once

#include <optional>
#include <string_view>

namespace pdserve {

// Credentials: "Bearer <cluster token>" between processes, "Bearer <API key>" from clients.
inline constexpr std::string_view kAuthorizationHeader = "Authorization";
// A client's API key as Anthropic's SDK sends it ("x-api-key: KEY"), accepted as the bearer.
inline constexpr std::string_view kApiKeyHeader = "x-api-key";
// W3C trace context, continued by the proxy, the decode node and the prefill node.
inline constexpr std::string_view kTraceparentHeader = "traceparent";
// Proxy -> decode node: the prefill nodes to try, in order ("URL[,URL...]"; cluster token only).
inline constexpr std::string_view kPrefillHeader = "X-Pdserve-Prefill";
// Proxy -> decode node (cluster token only): "1" asks a streamed answer (any n) to carry
// stream checkpoints, so the proxy can continue it elsewhere (common/protocol/stream_resume.h).
inline constexpr std::string_view kResumableHeader = "X-Pdserve-Resumable";
// Asks for the per-request timeline (usage.pdserve_timeline, docs/TRACING.md): the proxy sends
// it to decode nodes, clients to the proxy or a node.
inline constexpr std::string_view kTimelineHeader = "X-Pdserve-Timeline";

// Whether a kTimelineHeader value asks for the timeline: "1", "true" or "on", in any case. Words
// count too because some clients (aiperf) turn a header value of 1 into a number they refuse.
bool timeline_requested(std::optional<std::string_view> header_value);

}  // namespace pdserve
