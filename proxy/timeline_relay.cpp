#include "proxy/timeline_relay.h"

#include <algorithm>

#include "common/core/json_depth.h"
#include "common/protocol/request_timeline.h"
#include "proxy/address_redaction.h"

namespace pdserve::proxy {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kErrorEventPrefix = "data: {\"error\"";
// A choice's finish_reason with a value: JSON escapes every quote inside a string, so this
// text cannot come from generated content.
constexpr std::string_view kFinishReasonSet = "\"finish_reason\":\"";

// The length of the event at the start of `text` including its blank line, or npos when the
// blank line has not arrived. Looks no earlier than `from`.
size_t event_end(std::string_view text, size_t from) {
  const size_t lf = text.find("\n\n", from);
  const size_t crlf = text.find("\r\n\r\n", from);
  if (lf == std::string_view::npos && crlf == std::string_view::npos) return std::string_view::npos;
  if (crlf == std::string_view::npos || (lf != std::string_view::npos && lf < crlf + 2)) {
    return lf + 2;
  }
  return crlf + 4;
}

std::string_view trim(std::string_view text) {
  const auto is_space = [](char c) { return c == ' ' || c == '\r' || c == '\n' || c == '\t'; };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

// The JSON object in `text`, or InvalidArgument naming `where`.
Result<Json> parse_object(std::string_view text, std::string_view where) {
  PDS_ASSIGN_OR_RETURN(Json value, parse_json_bounded(text, where));
  if (!value.is_object()) return invalid_argument(std::string(where) + " is not a JSON object");
  return value;
}

// usage.pdserve_timeline of a response object, or nullopt.
Result<std::optional<Json>> usage_timeline(const Json& response, std::string_view where) {
  const auto usage = response.find("usage");
  if (usage == response.end() || !usage->is_object()) return std::optional<Json>();
  const auto timeline = usage->find(kTimelineUsageField);
  if (timeline == usage->end()) return std::optional<Json>();
  if (!timeline->is_object()) {
    return invalid_argument(std::string(where) + ": usage.pdserve_timeline is not an object");
  }
  return std::optional<Json>(*timeline);
}

}  // namespace

bool DeliveredStream::resumable() const {
  return !id.empty() && std::ranges::any_of(choices, [](const ResumedChoice& choice) {
    return !choice.finished;
  });
}

std::string SseRelay::feed(std::string_view bytes) {
  std::string out;
  if (overflowed_) return out;
  pending_.append(bytes);
  size_t start = 0;
  while (true) {
    const size_t end =
        event_end(std::string_view(pending_).substr(start), start == 0 ? scan_from_ : 0);
    if (end == std::string_view::npos) break;
    route_event(std::string_view(pending_).substr(start, end), out);
    start += end;
  }
  pending_.erase(0, start);
  if (pending_.size() + held_after_.size() > kMaxSseHeldBytes) {
    overflowed_ = true;
    pending_.clear();
    held_after_.clear();
    return out;
  }
  // A blank line may straddle reads: resume three bytes back ("\r\n\r" + "\n").
  scan_from_ = pending_.size() > 3 ? pending_.size() - 3 : 0;
  return out;
}

void SseRelay::note_checkpoint(std::string_view event) {
  Result<StreamCheckpoint> checkpoint = StreamCheckpoint::parse_comment(trim(event));
  if (!checkpoint.ok()) {
    problem_ = checkpoint.status();
    return;
  }
  if (delivered_.id.empty()) {
    delivered_.id = checkpoint->id;
    delivered_.created = checkpoint->created;
    delivered_.choices.resize(static_cast<size_t>(checkpoint->choices));
  }
  if (static_cast<size_t>(checkpoint->choices) != delivered_.choices.size()) {
    problem_ = invalid_argument("a stream checkpoint names " +
                                std::to_string(checkpoint->choices) + " choices, the stream has " +
                                std::to_string(delivered_.choices.size()));
    return;
  }
  checkpoints_.push_back(std::move(*checkpoint));
}

void SseRelay::note_forwarded(std::string_view event) {
  if (delivered_.id.empty()) return;  // no checkpoint yet: nothing to resume, nothing to scan
  // Several checkpoints in a row (the head's, then a choice's) all count with this event.
  for (StreamCheckpoint& checkpoint : checkpoints_) {
    ResumedChoice& choice = delivered_.choices[static_cast<size_t>(checkpoint.index)];
    choice.output_token_ids.insert(choice.output_token_ids.end(), checkpoint.token_ids.begin(),
                                   checkpoint.token_ids.end());
    if (checkpoint.sampler_state) choice.sampler_state = checkpoint.sampler_state;
  }
  if (event.find(kFinishReasonSet) != std::string_view::npos) {
    // The checkpoint just before an event names its choice.
    const size_t index = checkpoints_.empty() ? 0 : static_cast<size_t>(checkpoints_.back().index);
    delivered_.choices[index].finished = true;
  }
  checkpoints_.clear();
}

void SseRelay::route_event(std::string_view event, std::string& out) {
  if (event.starts_with(kStreamCheckpointPrefix)) {
    note_checkpoint(event);
    return;
  }
  note_forwarded(event);
  const bool held = usage_event_.has_value() || comment_held_;
  std::string& destination = held ? held_after_ : out;
  if (redact_errors_ && event.starts_with(kErrorEventPrefix)) {
    destination += "data: " + redact_error_body(trim(event.substr(5)), cluster_token_) + "\n\n";
    return;
  }
  if (event.find(kTimelineUsageField) == std::string_view::npos) {
    destination.append(event);
    return;
  }
  if (event.starts_with(kTimelineCommentPrefix)) {
    Result<Json> timeline = parse_object(trim(event.substr(kTimelineCommentPrefix.size())),
                                         "the ': pdserve_timeline' comment");
    if (timeline.ok()) {
      timeline_ = std::move(*timeline);
      comment_held_ = true;
    } else {
      problem_ = timeline.status();  // dropped: a comment is no client's business
    }
    return;
  }
  if (!usage_event_ && event.starts_with("data:")) {
    std::string_view data = event.substr(5);
    Result<Json> chunk = parse_object(trim(data), "the stream's usage chunk");
    Result<std::optional<Json>> timeline = chunk.ok()
                                               ? usage_timeline(*chunk, "the stream's usage chunk")
                                               : Result<std::optional<Json>>(chunk.status());
    if (timeline.ok() && timeline->has_value()) {
      timeline_ = std::move(**timeline);
      usage_event_ = std::move(*chunk);
      return;
    }
    if (!timeline.ok()) problem_ = timeline.status();
  }
  (held ? held_after_ : out).append(event);
}

const Json* SseRelay::usage() const {
  return usage_event_ && usage_event_->contains("usage") ? &(*usage_event_)["usage"] : nullptr;
}

std::string SseRelay::finish(const Json* client_timeline) {
  std::string out;
  if (usage_event_) {
    Json& usage = (*usage_event_)["usage"];
    if (client_timeline) {
      usage[kTimelineUsageField] = *client_timeline;
    } else {
      usage.erase(kTimelineUsageField);
    }
    out = "data: " + usage_event_->dump() + "\n\n";
    usage_event_.reset();
  } else if (comment_held_ && client_timeline) {
    out = std::string(kTimelineCommentPrefix) + client_timeline->dump() + "\n\n";
  }
  comment_held_ = false;
  out += held_after_;
  out += pending_;
  held_after_.clear();
  pending_.clear();
  scan_from_ = 0;
  return out;
}

Result<std::optional<TimelineBody>> parse_timeline_body(std::string_view body) {
  if (body.find(kTimelineUsageField) == std::string_view::npos)
    return std::optional<TimelineBody>();
  PDS_ASSIGN_OR_RETURN(Json response, parse_object(body, "the decode node's response body"));
  PDS_ASSIGN_OR_RETURN(std::optional<Json> timeline,
                       usage_timeline(response, "the decode node's response body"));
  if (!timeline) return std::optional<TimelineBody>();
  return std::optional<TimelineBody>(TimelineBody{std::move(response), std::move(*timeline)});
}

std::string TimelineBody::with_timeline(const Json* client_timeline) {
  Json& usage = response["usage"];
  if (client_timeline) {
    usage[kTimelineUsageField] = *client_timeline;
  } else {
    usage.erase(kTimelineUsageField);
  }
  return response.dump();
}

}  // namespace pdserve::proxy
