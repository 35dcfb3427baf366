// The request header that asks for the per-request timeline (usage.pdserve_timeline,
// docs/TRACING.md): the proxy sends it to decode nodes, clients send it to the proxy or a node.
#pragma once

#include <optional>
#include <string_view>

namespace pdserve {

inline constexpr std::string_view kTimelineHeader = "X-Pdserve-Timeline";

// Whether a header value asks for the timeline: "1", "true" or "on", in any case. Words count
// too because some clients (aiperf) turn a header value of 1 into a number they then refuse.
bool timeline_requested(std::optional<std::string_view> header_value);

}  // namespace pdserve
