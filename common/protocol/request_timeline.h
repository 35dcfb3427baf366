// The per-request timeline (docs/TRACING.md), a typed message with one serialiser and one
// parser. The decode node writes it (origin "decode", with `sync`) as its response's
// `usage.pdserve_timeline`, or as the SSE comment `: pdserve_timeline {json}` before
// `data: [DONE]` of a stream without a usage chunk. The proxy parses it, moves it onto its own
// clock (origin "proxy", without `sync`) and writes it for the client and GET /trace. The
// prefill node's spans reach the decode node in the prefill protocol's events
// (common/protocol/prefill_protocol.h), not in this message.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/core/status.h"

namespace pdserve {

// Where the timeline travels: the usage object's field and the SSE comment's prefix.
inline constexpr std::string_view kTimelineUsageField = "pdserve_timeline";
inline constexpr std::string_view kTimelineCommentPrefix = ": pdserve_timeline ";

// A span argument: a count (written as a JSON integer), a measurement or a name.
using TimelineArgValue = std::variant<int64_t, double, std::string>;
// By key: a JSON object's members have no order the parser could keep.
using TimelineArgs = std::map<std::string, TimelineArgValue, std::less<>>;

nlohmann::ordered_json timeline_args_json(const TimelineArgs& args);

struct RequestTimelineSpan {
  std::string name;  // "decode.request", "prefill.chunk", ...
  std::string node;  // "proxy", "decode <url>", "prefill <url>" (the role alone once redacted)
  double start_ms = 0;
  double end_ms = 0;  // >= start_ms
  TimelineArgs args;

  bool operator==(const RequestTimelineSpan&) const = default;
};

// The KV transfer of a remotely prefilled request, once its KV has landed.
struct KvTransferSummary {
  uint64_t bytes = 0;
  int blocks = 0;
  double ms = 0;                     // the kv.transfer span
  std::optional<double> gb_per_s;    // only when no layer overlapped the forward
  std::optional<double> exposed_ms;  // after the prefill node's last forward step
  int layers = 0;
  int layers_overlapped = 0;

  bool operator==(const KvTransferSummary&) const = default;
};

// Speculative decoding on the decode node (choice 0): verify steps, the drafts they checked,
// the drafts accepted. acceptance_rate is accepted_tokens / draft_tokens (written, not parsed).
struct SpecDecodeSummary {
  int64_t drafts = 0;
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;

  bool operator==(const SpecDecodeSummary&) const = default;
};

enum class TimelineOrigin { kDecode, kProxy };  // whose arrival is t = 0

struct RequestTimeline {
  static constexpr int kVersion = 1;

  std::string request_id;  // the response id
  std::string trace_id;    // W3C trace id
  TimelineOrigin origin = TimelineOrigin::kDecode;
  // `sync.head_sent_ms`: when the decode node sent its response head (the proxy's clock
  // alignment). A decode node's timeline always has it; the proxy drops it.
  std::optional<double> head_sent_ms;
  std::vector<RequestTimelineSpan> spans;
  std::vector<double> tokens_ms;  // when each output token of choice 0 left the decode node
  int64_t output_tokens = 0;
  std::optional<double> ttft_ms;  // null without tokens
  std::optional<double> tpot_ms;  // null below two tokens
  double e2e_ms = 0;
  std::optional<KvTransferSummary> kv_transfer;  // remotely prefilled requests only
  std::optional<SpecDecodeSummary> spec_decode;  // requests that verified drafts only

  // Times are ms after the origin's arrival; every field is written (ttft_ms and tpot_ms as
  // null when absent) but `sync`, `kv_transfer` and `spec_decode`, left out when absent.
  nlohmann::ordered_json to_json() const;
  // InvalidArgument naming the field ("timeline.spans[2].start_ms ...") for a missing or
  // mistyped field, a version other than 1, an unknown origin, a non-finite time, a negative
  // count, a span that ends before it starts, a span argument that is neither a number nor a
  // string, or a decode node's timeline without `sync`. Unknown fields are ignored.
  static Result<RequestTimeline> parse(const nlohmann::json& json);

  bool operator==(const RequestTimeline&) const = default;
};

}  // namespace pdserve
