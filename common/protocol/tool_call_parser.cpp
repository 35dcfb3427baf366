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
        break;
      }
      case State::kCall: {
        const size_t end = pending_.find(kToolCallEnd, end_scan_from_);
        if (end == std::string::npos) {
          // The end tag may start in the last bytes: look there again next time.
          end_scan_from_ = pending_.size() - std::min(pending_.size(), kToolCallEnd.size() - 1);
          return;
        }
        std::optional<ParsedToolCall> call =
            parse_tool_call(std::string_view(pending_).substr(0, end));
        const size_t block_end = end + kToolCallEnd.size();
        if (call) {
          delta.calls.push_back(std::move(*call));
          ++num_calls_;
          state_ = State::kAfterCall;
        } else {
          delta.content += kToolCallStart;
          delta.content.append(pending_, 0, block_end);
          state_ = State::kText;
        }
        pending_.erase(0, block_end);
        break;
      }
    }
  }
}

ToolCallDelta ToolCallParser::finish() {
  ToolCallDelta delta;
  if (state_ == State::kCall) {
    delta.content = std::string(kToolCallStart) + pending_;
  } else if (state_ == State::kText) {
    delta.content = std::move(pending_);
  }
  pending_.clear();
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
