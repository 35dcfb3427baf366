// The events of a decode node's SSE stream, typed (issue #29 item 4). The decode node's writer
// (serving/openai/generation_stream.cpp) makes its bytes with to_sse(); the proxy's relay
// (proxy/timeline_relay.cpp) reads each event once with parse_stream_event(). What the proxy
// decides from an event (a choice finished, the stream failed, the usage and the timeline, a
// checkpoint) comes from the parsed JSON, never from a substring of its text, so it does not
// depend on the writer's spacing or key order.
//
//   data: {"choices": [...], ...}           ChunkEvent: one or more choices
//   data: {"choices": [], "usage": {...}}   UsageEvent: the usage chunk (include_usage), maybe
//                                           with usage.pdserve_timeline (request_timeline.h)
//   data: {"error": {...}}                  ErrorEvent: the generation failed mid-stream
//   data: [DONE]                            DoneEvent
//   : pdserve_resume {...}                  CheckpointEvent (stream_resume.h)
//   : pdserve_timeline {...}                TimelineEvent: the timeline without include_usage
//   : anything else                         CommentEvent (e.g. a keep-alive)
//
// An event may span several `data:` lines (joined with "\n", as the SSE standard says) and
// end with "\n\n" or "\r\n\r\n"; `event:`, `id:` and `retry:` lines are ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/core/status.h"
#include "common/protocol/openai_error.h"
#include "common/protocol/stream_resume.h"

namespace pdserve {

// A choice of a chunk: which one, and its finish_reason once it has one.
struct ChunkChoice {
  int index = 0;
  std::optional<std::string> finish_reason;

  bool operator==(const ChunkChoice&) const = default;
};

struct ChunkEvent {
  nlohmann::ordered_json data;       // the chunk as the client gets it
  std::vector<ChunkChoice> choices;  // read from data["choices"]

  // The typed view of a chunk made by openai_response.h's builders.
  static ChunkEvent of(nlohmann::ordered_json data);
  bool operator==(const ChunkEvent&) const = default;
};

// A usage object's token counts (absent when not integers).
struct UsageCounts {
  std::optional<int64_t> prompt_tokens;
  std::optional<int64_t> completion_tokens;

  bool operator==(const UsageCounts&) const = default;
};

struct UsageEvent {
  nlohmann::ordered_json data;  // the usage chunk as the client gets it
  UsageCounts usage;
  // usage.pdserve_timeline: the decode node's timeline, when the proxy asked for it.
  std::optional<nlohmann::ordered_json> timeline;

  static UsageEvent of(nlohmann::ordered_json data);
  bool operator==(const UsageEvent&) const = default;
};

struct ErrorEvent {
  nlohmann::ordered_json data;  // {"error": {"message", "type", ...}}
  std::string message;
  std::string type;

  static ErrorEvent of(const ApiError& error);
  bool operator==(const ErrorEvent&) const = default;
};

struct DoneEvent {
  bool operator==(const DoneEvent&) const = default;
};

struct CheckpointEvent {
  StreamCheckpoint checkpoint;

  bool operator==(const CheckpointEvent&) const = default;
};

struct TimelineEvent {
  nlohmann::ordered_json timeline;  // a JSON object (docs/TRACING.md)

  bool operator==(const TimelineEvent&) const = default;
};

struct CommentEvent {
  std::string text;  // after ": "

  bool operator==(const CommentEvent&) const = default;
};

using StreamEvent = std::variant<ChunkEvent, UsageEvent, ErrorEvent, DoneEvent, CheckpointEvent,
                                 TimelineEvent, CommentEvent>;

// The whole event, blank line included: compact JSON on one `data:` line (invalid UTF-8
// replaced, never thrown), or one comment line.
std::string to_sse(const StreamEvent& event);

// One event (its blank line optional). InvalidArgument, naming what is wrong, for an event
// that is none of the above: malformed JSON (or nested deeper than kMaxJsonDepth), a choice
// without an integer index, a finish_reason that is not a string or null, an error without a
// message, a pdserve comment whose JSON is not what stream_resume.h or docs/TRACING.md say.
Result<StreamEvent> parse_stream_event(std::string_view event);

// The token counts of a usage object (any nlohmann JSON type).
template <typename JsonT>
UsageCounts read_usage_counts(const JsonT& usage) {
  UsageCounts counts;
  if (!usage.is_object()) return counts;
  const auto count = [&usage](const char* field) -> std::optional<int64_t> {
    const auto found = usage.find(field);
    if (found == usage.end() || !found->is_number_integer()) return std::nullopt;
    return found->template get<int64_t>();
  };
  counts.prompt_tokens = count("prompt_tokens");
  counts.completion_tokens = count("completion_tokens");
  return counts;
}

}  // namespace pdserve
