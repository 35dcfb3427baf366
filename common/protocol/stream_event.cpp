#include "common/protocol/stream_event.h"

#include "common/core/json_depth.h"
#include "common/protocol/openai_response.h"
#include "common/protocol/request_timeline.h"

namespace pdserve {
namespace {

using Ordered = nlohmann::ordered_json;

constexpr std::string_view kCheckpointTag = "pdserve_resume";
constexpr std::string_view kTimelineTag = "pdserve_timeline";

bool is_blank(char c) {
  return c == ' ' || c == '\t';
}

std::string_view trim(std::string_view text) {
  while (!text.empty() &&
         (is_blank(text.front()) || text.front() == '\r' || text.front() == '\n')) {
    text.remove_prefix(1);
  }
  while (!text.empty() && (is_blank(text.back()) || text.back() == '\r' || text.back() == '\n')) {
    text.remove_suffix(1);
  }
  return text;
}

// The JSON in `text` with its key order kept (what the client gets back), bounded in depth.
Result<Ordered> parse_ordered(std::string_view text, std::string_view what) {
  PDS_RETURN_IF_ERROR(check_json_depth(text, what));
  Ordered value = Ordered::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return invalid_argument(std::string(what) + " is not valid JSON");
  if (!value.is_object()) return invalid_argument(std::string(what) + " is not a JSON object");
  return value;
}

// `comment` (after its ':') as "<tag> {json}" with any blanks around the tag: the JSON text,
// or nullopt when the comment is not that tag's.
std::optional<std::string_view> tagged(std::string_view comment, std::string_view tag) {
  while (!comment.empty() && is_blank(comment.front())) comment.remove_prefix(1);
  if (!comment.starts_with(tag)) return std::nullopt;
  comment.remove_prefix(tag.size());
  if (!comment.empty() && !is_blank(comment.front()) && comment.front() != '{') return std::nullopt;
  return trim(comment);
}

Result<StreamEvent> parse_comment(std::string_view comment) {
  if (const std::optional<std::string_view> json = tagged(comment, kCheckpointTag)) {
    PDS_ASSIGN_OR_RETURN(const nlohmann::json value,
                         parse_json_bounded(*json, "the stream checkpoint"));
    PDS_ASSIGN_OR_RETURN(StreamCheckpoint checkpoint, StreamCheckpoint::parse(value));
    return StreamEvent(CheckpointEvent{std::move(checkpoint)});
  }
  if (const std::optional<std::string_view> json = tagged(comment, kTimelineTag)) {
    PDS_ASSIGN_OR_RETURN(Ordered timeline,
                         parse_ordered(*json, "the ': pdserve_timeline' comment"));
    return StreamEvent(TimelineEvent{std::move(timeline)});
  }
  return StreamEvent(CommentEvent{std::string(comment)});
}

Status check_choices(const Ordered& choices) {
  for (size_t i = 0; i < choices.size(); ++i) {
    const Ordered& choice = choices[i];
    const std::string where = "the chunk's choices[" + std::to_string(i) + "]";
    if (!choice.is_object()) return invalid_argument(where + " is not a JSON object");
    const auto index = choice.find("index");
    if (index == choice.end() || !index->is_number_integer() || index->get<int64_t>() < 0 ||
        index->get<int64_t>() >= kMaxStreamChoices) {
      return invalid_argument(where + ": 'index' must be an integer from 0 to " +
                              std::to_string(kMaxStreamChoices - 1));
    }
    const auto reason = choice.find("finish_reason");
    if (reason != choice.end() && !reason->is_null() && !reason->is_string()) {
      return invalid_argument(where + ": 'finish_reason' must be a string or null");
    }
  }
  return Status::ok_status();
}

Result<StreamEvent> parse_data(std::string_view text) {
  if (trim(text) == "[DONE]") return StreamEvent(DoneEvent{});
  PDS_ASSIGN_OR_RETURN(Ordered data, parse_ordered(text, "the event's data"));
  if (const auto error = data.find("error"); error != data.end() && !error->is_null()) {
    const auto message = error->is_object() ? error->find("message") : error->end();
    if (!error->is_object() || message == error->end() || !message->is_string()) {
      return invalid_argument("the error event has no error.message string");
    }
    ErrorEvent event;
    event.message = message->get<std::string>();
    if (const auto type = error->find("type"); type != error->end() && type->is_string()) {
      event.type = type->get<std::string>();
    }
    event.data = std::move(data);
    return StreamEvent(std::move(event));
  }
  const auto choices = data.find("choices");
  if (choices != data.end() && !choices->is_array()) {
    return invalid_argument("the chunk's 'choices' is not an array");
  }
  const bool no_choices = choices == data.end() || choices->empty();
  const auto usage = data.find("usage");
  if (no_choices && usage != data.end() && usage->is_object()) {
    if (const auto timeline = usage->find(kTimelineUsageField);
        timeline != usage->end() && !timeline->is_object()) {
      return invalid_argument("the usage chunk's usage.pdserve_timeline is not an object");
    }
    return StreamEvent(UsageEvent::of(std::move(data)));
  }
  if (no_choices) {
    return invalid_argument(
        "the event's data is neither a chunk with choices, the usage chunk "
        "nor an error");
  }
  PDS_RETURN_IF_ERROR(check_choices(*choices));
  return StreamEvent(ChunkEvent::of(std::move(data)));
}

}  // namespace

ChunkEvent ChunkEvent::of(Ordered data) {
  ChunkEvent event;
  if (const auto choices = data.find("choices"); choices != data.end() && choices->is_array()) {
    for (const Ordered& choice : *choices) {
      ChunkChoice entry;
      if (const auto index = choice.find("index");
          index != choice.end() && index->is_number_integer()) {
        entry.index = index->get<int>();
      }
      if (const auto reason = choice.find("finish_reason");
          reason != choice.end() && reason->is_string()) {
        entry.finish_reason = reason->get<std::string>();
      }
      event.choices.push_back(std::move(entry));
    }
  }
  event.data = std::move(data);
  return event;
}

UsageEvent UsageEvent::of(Ordered data) {
  UsageEvent event;
  if (const auto usage = data.find("usage"); usage != data.end() && usage->is_object()) {
    event.usage = read_usage_counts(*usage);
    if (const auto timeline = usage->find(kTimelineUsageField);
        timeline != usage->end() && timeline->is_object()) {
      event.timeline = *timeline;
    }
  }
  event.data = std::move(data);
  return event;
}

ErrorEvent ErrorEvent::of(const ApiError& error) {
  return {Ordered::parse(error.body()), error.message, error.type};
}

std::string to_sse(const StreamEvent& event) {
  struct Writer {
    std::string operator()(const ChunkEvent& chunk) const { return sse_event(chunk.data); }
    std::string operator()(const UsageEvent& usage) const { return sse_event(usage.data); }
    std::string operator()(const ErrorEvent& error) const { return sse_event(error.data); }
    std::string operator()(const DoneEvent&) const { return sse_done(); }
    std::string operator()(const CheckpointEvent& checkpoint) const {
      return checkpoint.checkpoint.to_comment();
    }
    std::string operator()(const TimelineEvent& timeline) const {
      return std::string(kTimelineCommentPrefix) + to_json_text(timeline.timeline) + "\n\n";
    }
    std::string operator()(const CommentEvent& comment) const {
      // One comment line per line of the text.
      std::string out;
      std::string_view rest = comment.text;
      while (true) {
        const size_t end = rest.find('\n');
        out += ": ";
        out += rest.substr(0, end);
        out += "\n";
        if (end == std::string_view::npos) break;
        rest.remove_prefix(end + 1);
      }
      return out + "\n";
    }
  };
  return std::visit(Writer{}, event);
}

Result<StreamEvent> parse_stream_event(std::string_view event) {
  std::string data;
  bool has_data = false;
  std::string comment;
  int comments = 0;
  while (!event.empty()) {
    const size_t end = event.find('\n');
    std::string_view line = event.substr(0, end);
    event.remove_prefix(end == std::string_view::npos ? event.size() : end + 1);
    if (line.ends_with('\r')) line.remove_suffix(1);
    if (line.empty()) continue;
    if (line.front() == ':') {
      line.remove_prefix(1);
      if (line.starts_with(' ')) line.remove_prefix(1);
      if (comments++ > 0) comment += '\n';
      comment += line;
      continue;
    }
    const size_t colon = line.find(':');
    if (line.substr(0, colon) != "data") continue;  // event:, id:, retry: and unknown fields
    std::string_view value =
        colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
    if (value.starts_with(' ')) value.remove_prefix(1);
    if (has_data) data += '\n';
    data += value;
    has_data = true;
  }
  if (has_data) {
    if (comments > 0 && (tagged(comment, kCheckpointTag) || tagged(comment, kTimelineTag))) {
      return invalid_argument("a pdserve comment shares its event with data");
    }
    return parse_data(data);
  }
  if (comments == 0) return invalid_argument("the event has neither data nor a comment");
  if (comments > 1 && (tagged(comment, kCheckpointTag) || tagged(comment, kTimelineTag))) {
    return invalid_argument("a pdserve comment spans more than one line");
  }
  return parse_comment(comment);
}

}  // namespace pdserve
