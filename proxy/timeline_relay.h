// Finds the decode node's timeline (issue #7 format, docs/TRACING.md) in the response the proxy
// relays, and puts the proxy's aligned version back where the client gets one. The relay stays
// cheap: bytes pass through untouched except the one event that carries the timeline.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/core/status.h"
#include "common/protocol/stream_event.h"
#include "common/protocol/stream_resume.h"

namespace pdserve::proxy {

// What a client has received of a resumable stream: enough to continue it on another node.
struct DeliveredStream {
  std::string id;  // empty until the node's first checkpoint
  int64_t created = 0;
  // Per choice (as many as the first checkpoint names): every token whose event was relayed,
  // the sampler state after the last of them, and whether its finish chunk was relayed.
  std::vector<ResumedChoice> choices;

  // Whether another node can take the stream over: it has an id and a choice left to finish.
  bool resumable() const;
  StreamResume resume() const { return {id, created, choices}; }
};

// The most bytes an SSE relay holds back: the client connection's stream queue (8 MiB,
// http::ServerOptions) could not take a larger event in one piece anyway.
inline constexpr size_t kMaxSseHeldBytes = size_t{8} << 20;

// Frames a relayed SSE stream into events (split across reads in any way; "\n\n" or
// "\r\n\r\n" ends an event), reads each once as a typed event
// (common/protocol/stream_event.h) and forwards it as it came, except:
//  * the timeline comment (TimelineEvent): recorded and held back, with everything after it,
//    until finish() puts the client's timeline (if any) in its place;
//  * the usage chunk with `usage.pdserve_timeline` (UsageEvent): likewise;
//  * with redact_errors(), an error event (ErrorEvent) has the addresses in its message and
//    the cluster token redacted;
//  * a stream checkpoint (CheckpointEvent, common/protocol/stream_resume.h): dropped; its
//    tokens count as delivered once the next event has been forwarded, and a chunk's choice
//    with a finish_reason is finished;
//  * an event that cannot be read: forwarded as it came (a problem()), or dropped when it
//    starts as a comment (an unreadable pdserve comment).
// What the relay holds back (an event not yet complete, the events after a timeline carrier)
// is bounded by kMaxSseHeldBytes: past it the stream cannot be relayed (overflowed()).
class SseRelay {
 public:
  SseRelay() = default;
  // Continues a stream resumed on another node: its delivered tokens so far.
  explicit SseRelay(DeliveredStream delivered) : delivered_(std::move(delivered)) {}

  // Error events pass with their addresses and `cluster_token` redacted (a client without the
  // token).
  void redact_errors(std::string cluster_token) {
    redact_errors_ = true;
    cluster_token_ = std::move(cluster_token);
  }

  // Takes the next bytes of the stream; returns the bytes to forward now (maybe none). Nothing
  // once overflowed().
  std::string feed(std::string_view bytes);
  // The relay held more than kMaxSseHeldBytes (e.g. an event without its blank line): it dropped
  // them, and the stream must end with an error.
  bool overflowed() const { return overflowed_; }

  const DeliveredStream& delivered() const { return delivered_; }

  // The node's timeline, once an event has carried one.
  const std::optional<nlohmann::json>& timeline() const { return timeline_; }
  // The token counts of the held usage chunk (streams with include_usage), until finish().
  std::optional<UsageCounts> usage() const;
  // Why the last unreadable event (or checkpoint that does not fit the stream) could not be
  // read: it was forwarded as it came, or dropped if it was a comment.
  const std::optional<Status>& problem() const { return problem_; }

  // At the end of the stream: what is still held back, the timeline carrier first, with
  // `client_timeline` in place of the node's (without a timeline when it is null: the usage
  // event loses usage.pdserve_timeline, the comment is dropped), then any incomplete trailing
  // bytes as they came.
  std::string finish(const nlohmann::json* client_timeline);

 private:
  // Decides what happens to one complete event; appends what to forward now to `out`.
  void route_event(std::string_view event, std::string& out);
  // Records a checkpoint, or the delivery of the event after it (null: an unreadable one).
  void note_checkpoint(StreamCheckpoint checkpoint);
  void note_forwarded(const StreamEvent* event);

  std::string pending_;   // bytes of the event not yet complete
  size_t scan_from_ = 0;  // where to resume looking for the end of the pending event
  std::optional<nlohmann::json> timeline_;
  std::optional<UsageEvent> usage_event_;      // the held usage chunk
  bool comment_held_ = false;                  // the timeline came as the comment
  std::string held_after_;                     // events after the carrier
  bool redact_errors_ = false;
  std::string cluster_token_;
  bool overflowed_ = false;
  std::optional<Status> problem_;
  DeliveredStream delivered_;
  std::vector<StreamCheckpoint> checkpoints_;  // wait for the event they precede
};

// A non-streaming response body that carries `usage.pdserve_timeline`, parsed once.
struct TimelineBody {
  nlohmann::json response;
  nlohmann::json timeline;  // response.usage.pdserve_timeline as the node sent it
  UsageCounts counts;       // response.usage's token counts

  // The body with `usage.pdserve_timeline` replaced by `client_timeline`, or without it when
  // that is null.
  std::string with_timeline(const nlohmann::json* client_timeline);
};

// nullopt when the body has no timeline, InvalidArgument when it cannot be read. Bodies
// without the text are not parsed.
Result<std::optional<TimelineBody>> parse_timeline_body(std::string_view body);

}  // namespace pdserve::proxy
