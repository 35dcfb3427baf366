// Builds the per-request timeline the decode node returns as `usage.pdserve_timeline` (the
// typed message RequestTimeline, common/protocol/request_timeline.h; docs/TRACING.md): its
// spans, the time each output token of choice 0 left the node, TTFT/TPOT/e2e, the KV transfer,
// and when the HTTP head went out (for the proxy's clock alignment). All times are ms after the
// decode node's arrival of the HTTP request, on its steady clock; the prefill node's spans (ms
// after its receipt of the work) are shifted by the NTP-style estimate of that receipt.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/engine/inference_service.h"
#include "common/protocol/request_timeline.h"

namespace pdserve {

// One choice (engine request), as its final delta reported it.
struct ChoiceTimeline {
  int index = 0;
  RequestTimings timings;
  std::optional<RemotePrefillStats> remote_prefill;
  int completion_tokens = 0;
  SteadyTime final_delta{};  // the final delta reached the API server
  SpecDecodeCounts spec_decode;  // its drafts (speculative decoding)
};

struct RequestTimelineInput {
  std::string request_id;  // the response id
  std::string trace_id;
  std::string node;        // "decode http://host:port"
  SteadyTime arrival{};    // t = 0
  SteadyTime head_sent{};  // the HTTP response head was handed to the connection
  // Choice 0's output tokens, when they were handed to the connection (non-streaming: when
  // the server received them; they leave with the response).
  std::vector<SteadyTime> token_times;
  std::vector<ChoiceTimeline> choices;  // by index
};

double milliseconds_after(SteadyTime origin, SteadyTime time);

// The callee's receipt of a request on the caller's clock, assuming symmetric one-way delays:
// the caller sent it at `sent_ms`, the answer's head arrived at `head_received_ms`, and the
// callee says it sent that head `head_sent_ms` after its receipt. Never before `sent_ms`.
double aligned_receipt_ms(double sent_ms, double head_received_ms, double head_sent_ms);

// (e2e - ttft) / (output_tokens - 1); nullopt below two tokens.
std::optional<double> time_per_output_token_ms(double ttft_ms, double e2e_ms, int output_tokens);

// The timeline with origin "decode". For n > 1 or several prompts the spans appear per choice
// (args.index); tokens_ms, output_tokens, ttft, tpot, e2e and kv_transfer describe choice 0.
RequestTimeline build_request_timeline(const RequestTimelineInput& input);

}  // namespace pdserve
