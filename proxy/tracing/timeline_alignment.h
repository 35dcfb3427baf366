// Moves a decode node's timeline onto the proxy's clock (docs/TRACING.md, "Clock alignment"):
// one NTP-style measurement per request. The proxy knows when it sent the request (s) and when
// the response head arrived (h); the node reports when it sent the head after its own arrival
// (sync.head_sent_ms). With symmetric one-way delays the node's arrival was at
// s + ((h - s) - head_sent_ms) / 2 on the proxy's clock, give or take half of
// (h - s) - head_sent_ms (the network's share of the round trip).
#pragma once

#include <string>
#include <vector>

#include "common/core/status.h"
#include "common/protocol/request_timeline.h"

namespace pdserve::proxy {

// One try at a decode node, in ms after the proxy's arrival.
struct RouteAttempt {
  double start_ms = 0.0;  // when the proxy began routing this try
  double sent_ms = 0.0;   // when the upstream request was sent
  std::string decode_id;
  std::string prefill_id;  // empty: the decode node prefills itself
  std::string placement;   // "remote", "local" or "cached" (PrefillPlacement)
};

// What the proxy measured for one request, in ms after its arrival.
struct ProxyMeasurements {
  std::string trace_id;
  std::vector<RouteAttempt> routes;  // every try; the last one answered
  double head_ms = 0.0;              // the answering node's response head arrived
  double end_ms = 0.0;               // the last byte was forwarded to the client
};

struct ClockOffset {
  double node_arrival_ms = 0.0;  // the node's t = 0 on the proxy's clock
  double one_way_ms = 0.0;       // estimated network delay each way
};

// The offset from s, h and head_sent_ms (a head_sent_ms above h - s counts as no delay).
ClockOffset estimate_offset(double sent_ms, double head_ms, double head_sent_ms);

// The timeline as the client saw it: every span and token time shifted onto the proxy's
// clock, proxy.request and proxy.route spans added, origin "proxy", sync dropped, trace_id the
// proxy's, ttft_ms the first token plus the one-way delay, e2e_ms the proxy's end, tpot_ms from
// those. InvalidArgument when `node_timeline` is not a decode node's or no request was sent.
Result<RequestTimeline> align_timeline(const RequestTimeline& node_timeline,
                                       const ProxyMeasurements& proxy);

}  // namespace pdserve::proxy
