#include "proxy/tracing/timeline_alignment.h"

#include <algorithm>

namespace pdserve::proxy {

ClockOffset estimate_offset(double sent_ms, double head_ms, double head_sent_ms) {
  const double network_ms = std::max(0.0, (head_ms - sent_ms) - head_sent_ms);
  return {sent_ms + network_ms / 2.0, network_ms / 2.0};
}

Result<RequestTimeline> align_timeline(const RequestTimeline& node_timeline,
                                       const ProxyMeasurements& proxy) {
  // RequestTimeline::parse() gives a decode node's timeline its head_sent_ms.
  if (node_timeline.origin != TimelineOrigin::kDecode || !node_timeline.head_sent_ms) {
    return invalid_argument("timeline.origin is not 'decode': only a node's timeline is aligned");
  }
  if (proxy.routes.empty()) return invalid_argument("no upstream request was sent");
  const double sent_ms = proxy.routes.back().sent_ms;
  ClockOffset offset = estimate_offset(sent_ms, proxy.head_ms, *node_timeline.head_sent_ms);
  // Causality bounds the estimate from the other end too: the node sent its last byte
  // before the proxy forwarded it. The symmetric-delay guess can break that when the head
  // and the end took different times to cross (a loaded machine).
  const double latest_arrival = proxy.end_ms - node_timeline.e2e_ms;
  if (offset.node_arrival_ms > latest_arrival) {
    offset.node_arrival_ms = std::max(sent_ms, latest_arrival);
    offset.one_way_ms = offset.node_arrival_ms - sent_ms;
  }

  RequestTimeline aligned = node_timeline;
  aligned.origin = TimelineOrigin::kProxy;
  aligned.trace_id = proxy.trace_id;
  aligned.head_sent_ms.reset();
  aligned.spans.clear();
  aligned.spans.push_back({"proxy.request",
                           "proxy",
                           0.0,
                           proxy.end_ms,
                           {{"attempts", static_cast<int64_t>(proxy.routes.size())}}});
  for (const RouteAttempt& route : proxy.routes) {
    TimelineArgs args = {{"decode", route.decode_id}};
    if (!route.prefill_id.empty()) args["prefill"] = route.prefill_id;
    if (!route.placement.empty()) args["placement"] = route.placement;
    aligned.spans.push_back(
        {"proxy.route", "proxy", route.start_ms, route.sent_ms, std::move(args)});
  }
  for (RequestTimelineSpan span : node_timeline.spans) {
    span.start_ms += offset.node_arrival_ms;
    span.end_ms += offset.node_arrival_ms;
    aligned.spans.push_back(std::move(span));
  }
  for (double& time : aligned.tokens_ms) time += offset.node_arrival_ms;

  const double e2e = proxy.end_ms;
  aligned.e2e_ms = e2e;
  aligned.ttft_ms.reset();
  aligned.tpot_ms.reset();
  if (!aligned.tokens_ms.empty()) {
    const double ttft = std::min(aligned.tokens_ms.front() + offset.one_way_ms, e2e);
    aligned.ttft_ms = ttft;
    if (aligned.output_tokens >= 2) {
      aligned.tpot_ms = (e2e - ttft) / static_cast<double>(aligned.output_tokens - 1);
    }
  }
  return aligned;
}

}  // namespace pdserve::proxy
