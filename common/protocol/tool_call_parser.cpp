#include "common/protocol/tool_call_parser.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "common/core/json_depth.h"

namespace pdserve {
namespace {

constexpr std::string_view kJsonSpace = " \t\n\r";

std::string_view trim_json_space(std::string_view text) {
  const size_t first = text.find_first_not_of(kJsonSpace);
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(kJsonSpace) - first + 1);
}

size_t skip_space(std::string_view text, size_t pos) {
  const size_t next = text.find_first_not_of(kJsonSpace, pos);
  return next == std::string_view::npos ? text.size() : next;
}

// Just past the JSON value that starts at `pos` of a text the JSON parser accepted.
size_t skip_value(std::string_view text, size_t pos) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = pos; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
        if (depth == 0) return i + 1;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (depth == 0) return i;  // ends a scalar member
      if (--depth == 0) return i + 1;
    } else if (depth == 0 && (c == ',' || kJsonSpace.find(c) != std::string_view::npos)) {
      return i;
    }
  }
  return text.size();
}

// Length of `text` without an incomplete UTF-8 sequence at its end.
size_t complete_utf8_length(std::string_view text) {
  // The last lead byte among the last four, and how long its sequence is.
  for (size_t back = 1; back <= std::min<size_t>(4, text.size()); ++back) {
    const auto byte = static_cast<unsigned char>(text[text.size() - back]);
    if ((byte & 0xC0) == 0x80) continue;  // a continuation byte
    const size_t length = byte >= 0xF0 ? 4 : byte >= 0xE0 ? 3 : byte >= 0xC0 ? 2 : 1;
    return length > back ? text.size() - back : text.size();
  }
  return text.size();
}

// Length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t partial_tag_length(std::string_view text, std::string_view tag) {
  for (size_t length = std::min(text.size(), tag.size() - 1); length > 0; --length) {
    if (text.substr(text.size() - length) == tag.substr(0, length)) return length;
  }
  return 0;
}

}  // namespace

std::optional<ParsedToolCall> parse_tool_call(std::string_view body) {
  const std::string_view object = trim_json_space(body);
  if (!check_json_depth(object, "a tool call").ok()) return std::nullopt;
  const nlohmann::json parsed = nlohmann::json::parse(object, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) return std::nullopt;
  // The members in the text's order, with their raw values: the parse above validated the
  // text, so the scan only needs to find where each value ends.
  std::optional<std::string> name;
  std::optional<std::string_view> arguments;
  size_t pos = skip_space(object, 1);
  while (object[pos] != '}') {
    const size_t key_end = skip_value(object, pos);
    const auto key = nlohmann::json::parse(object.substr(pos, key_end - pos)).get<std::string>();
    pos = skip_space(object, skip_space(object, key_end) + 1);  // past the ':'
    const size_t value_end = skip_value(object, pos);
    const std::string_view value = object.substr(pos, value_end - pos);
    if (key == "name" && !name && value.starts_with('"')) {
      name = nlohmann::json::parse(value).get<std::string>();
    } else if (key == "arguments" && !arguments && value.starts_with('{')) {
      arguments = value;
    } else {
      return std::nullopt;  // another member, a repeated one, or a value of the wrong type
    }
    pos = skip_space(object, value_end);
    if (object[pos] == ',') pos = skip_space(object, pos + 1);
  }
  if (!name || name->empty() || !arguments) return std::nullopt;
  return ParsedToolCall{std::move(*name), std::string(*arguments)};
}

ToolCallDelta ToolCallParser::push(std::string_view piece) {
  pending_.append(piece);
  ToolCallDelta delta;
  run(delta);
  return delta;
}

void ToolCallParser::run(ToolCallDelta& delta) {
  while (!pending_.empty()) {
    switch (state_) {
      case State::kAfterCall: {
        const size_t first = pending_.find_first_not_of(kJsonSpace);
        pending_.erase(0, first);  // npos erases everything
        if (first == std::string::npos) return;
        state_ = State::kText;
        break;
      }
      case State::kText: {
        const size_t start = pending_.find(kToolCallStart);
        if (start == std::string::npos) {
          const size_t emitted = pending_.size() - partial_tag_length(pending_, kToolCallStart);
          delta.content.append(pending_, 0, emitted);
          pending_.erase(0, emitted);
          return;
        }
        delta.content.append(pending_, 0, start);
        pending_.erase(0, start + kToolCallStart.size());
        state_ = State::kCall;
        end_scan_from_ = 0;
        scanner_ = ToolCallBodyScanner();
        scanned_ = 0;
        announced_index_.reset();
        arguments_sent_ = 0;
        break;
      }
      case State::kCall:
        if (!read_call(delta)) return;
        break;
      case State::kNotACall: {
        const size_t end = pending_.find(kToolCallEnd);
        if (end == std::string::npos) {
          const size_t emitted = pending_.size() - partial_tag_length(pending_, kToolCallEnd);
          delta.content.append(pending_, 0, emitted);
          pending_.erase(0, emitted);
          return;
        }
        const size_t block_end = end + kToolCallEnd.size();
        delta.content.append(pending_, 0, block_end);
        pending_.erase(0, block_end);
        state_ = State::kText;
        break;
      }
    }
  }
}

bool ToolCallParser::read_call(ToolCallDelta& delta) {
  const size_t end = pending_.find(kToolCallEnd, end_scan_from_);
  // The body goes up to the end tag, or up to a possible partial one, which is not read yet:
  // it may end the block.
  const size_t body_end =
      end != std::string::npos ? end : pending_.size() - partial_tag_length(pending_, kToolCallEnd);
  end_scan_from_ = body_end;
  bool still_a_call = true;
  for (; still_a_call && scanned_ < body_end; ++scanned_) {
    still_a_call = scanner_.consume(pending_[scanned_]);
  }
  // What the bytes before a rejected one made known goes out first, so that what a stream has
  // sent depends on the text only, not on how it was cut into pieces.
  if (!still_a_call) --scanned_;
  if (!announced_index_ && scanner_.name()) {
    announced_index_ = num_announced_++;
    add_fragment(delta, *scanner_.name(), "");
  }
  send_arguments(delta);
  if (!still_a_call) {
    give_up_call(delta);
    return true;
  }
  if (end == std::string::npos) return false;
  // The final parse decides (it also checks what the scanner leaves to it), and gives the
  // whole answer's call.
  std::optional<ParsedToolCall> call;
  if (scanner_.object_closed()) call = parse_tool_call(std::string_view(pending_).substr(0, end));
  if (!call) {
    give_up_call(delta);
    return true;
  }
  delta.calls.push_back(std::move(*call));
  ++num_calls_;
  pending_.erase(0, end + kToolCallEnd.size());
  state_ = State::kAfterCall;
  return true;
}

void ToolCallParser::send_arguments(ToolCallDelta& delta) {
  if (!announced_index_ || !scanner_.arguments_begin()) return;
  const size_t begin = *scanner_.arguments_begin();
  // While the arguments are open, everything read belongs to them (the scanner has not
  // rejected it) but for a UTF-8 sequence cut by the piece: a client decodes each fragment.
  const size_t end = scanner_.arguments_end().value_or(
      begin + complete_utf8_length(std::string_view(pending_).substr(begin, scanned_ - begin)));
  if (end <= begin + arguments_sent_) return;
  add_fragment(
      delta, std::nullopt,
      std::string_view(pending_).substr(begin + arguments_sent_, end - begin - arguments_sent_));
  arguments_sent_ = end - begin;
}

void ToolCallParser::add_fragment(ToolCallDelta& delta, std::optional<std::string> name,
                                  std::string_view arguments) {
  if (!name && !delta.fragments.empty() && delta.fragments.back().index == *announced_index_) {
    delta.fragments.back().arguments.append(arguments);
    return;
  }
  delta.fragments.push_back({*announced_index_, std::move(name), std::string(arguments)});
}

void ToolCallParser::give_up_call(ToolCallDelta& delta) {
  delta.content += kToolCallStart;
  announced_index_.reset();
  state_ = State::kNotACall;
}

ToolCallDelta ToolCallParser::finish() {
  ToolCallDelta delta;
  if (state_ == State::kCall) {
    delta.content = std::string(kToolCallStart) + pending_;
  } else if (state_ == State::kText || state_ == State::kNotACall) {
    delta.content = std::move(pending_);
  }
  pending_.clear();
  announced_index_.reset();
  return delta;
}

ToolCallDelta split_tool_calls(std::string_view text) {
  ToolCallParser parser;
  ToolCallDelta whole = parser.push(text);
  ToolCallDelta tail = parser.finish();
  whole.content += tail.content;
  return whole;
}

}  // namespace pdserve
