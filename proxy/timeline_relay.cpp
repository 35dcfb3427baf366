#include "proxy/timeline_relay.h"

#include <algorithm>

#include "common/core/json_depth.h"
#include "common/protocol/openai_response.h"
#include "common/protocol/request_timeline.h"
#include "proxy/address_redaction.h"

namespace pdserve::proxy {
namespace {

using Json = nlohmann::json;

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

void SseRelay::note_checkpoint(StreamCheckpoint checkpoint) {
  if (delivered_.id.empty()) {
    delivered_.id = checkpoint.id;
    delivered_.created = checkpoint.created;
    delivered_.choices.resize(static_cast<size_t>(checkpoint.choices));
  }
  if (static_cast<size_t>(checkpoint.choices) != delivered_.choices.size()) {
    problem_ =
        invalid_argument("a stream checkpoint names " + std::to_string(checkpoint.choices) +
                         " choices, the stream has " + std::to_string(delivered_.choices.size()));
    return;
  }
  checkpoints_.push_back(std::move(checkpoint));
}

void SseRelay::note_forwarded(const StreamEvent* event) {
  if (delivered_.id.empty()) return;  // no checkpoint yet: nothing to resume
  // Several checkpoints in a row (the head's, then a choice's) all count with this event.
  for (StreamCheckpoint& checkpoint : checkpoints_) {
    ResumedChoice& choice = delivered_.choices[static_cast<size_t>(checkpoint.index)];
    choice.output_token_ids.insert(choice.output_token_ids.end(), checkpoint.token_ids.begin(),
                                   checkpoint.token_ids.end());
    if (checkpoint.sampler_state) choice.sampler_state = checkpoint.sampler_state;
  }
  checkpoints_.clear();
  const auto* chunk = event ? std::get_if<ChunkEvent>(event) : nullptr;
  if (chunk == nullptr) return;
  for (const ChunkChoice& choice : chunk->choices) {
    if (!choice.finish_reason) continue;
    if (static_cast<size_t>(choice.index) >= delivered_.choices.size()) {
      problem_ = invalid_argument("a chunk finishes choice " + std::to_string(choice.index) +
                                  ", the stream has " + std::to_string(delivered_.choices.size()));
      continue;
    }
    delivered_.choices[static_cast<size_t>(choice.index)].finished = true;
  }
}

void SseRelay::route_event(std::string_view event, std::string& out) {
  Result<StreamEvent> parsed = parse_stream_event(event);
  if (!parsed.ok()) {
    problem_ = parsed.status();
    // An unreadable pdserve comment is no client's business: dropped. Anything else passes as
    // it came, and its checkpoint's tokens count as delivered.
    if (event.starts_with(':')) return;
    note_forwarded(nullptr);
    ((usage_event_ || comment_held_) ? held_after_ : out).append(event);
    return;
  }
  StreamEvent& typed = *parsed;
  if (auto* checkpoint = std::get_if<CheckpointEvent>(&typed)) {
    note_checkpoint(std::move(checkpoint->checkpoint));
    return;
  }
  if (const auto* timeline = std::get_if<TimelineEvent>(&typed)) {
    timeline_ = Json(timeline->timeline);
    comment_held_ = true;
    return;
  }
  note_forwarded(&typed);
  std::string& destination = (usage_event_ || comment_held_) ? held_after_ : out;
  if (const auto* error = std::get_if<ErrorEvent>(&typed); error && redact_errors_) {
    destination += "data: " + redact_error_body(to_json_text(error->data), cluster_token_) + "\n\n";
    return;
  }
  if (auto* usage = std::get_if<UsageEvent>(&typed); usage && usage->timeline && !usage_event_) {
    timeline_ = Json(*usage->timeline);
    usage_event_ = std::move(*usage);
    return;
  }
  destination.append(event);
}

std::optional<UsageCounts> SseRelay::usage() const {
  if (!usage_event_) return std::nullopt;
  return usage_event_->usage;
}

std::string SseRelay::finish(const Json* client_timeline) {
  std::string out;
  if (usage_event_) {
    nlohmann::ordered_json& usage = usage_event_->data["usage"];
    if (client_timeline) {
      usage[kTimelineUsageField] = *client_timeline;
    } else {
      usage.erase(kTimelineUsageField);
    }
    out = to_sse(UsageEvent::of(std::move(usage_event_->data)));
    usage_event_.reset();
  } else if (comment_held_ && client_timeline) {
    out = to_sse(TimelineEvent{*client_timeline});
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
  UsageCounts usage = read_usage_counts(response["usage"]);
  return std::optional<TimelineBody>(
      TimelineBody{std::move(response), std::move(*timeline), std::move(usage)});
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
