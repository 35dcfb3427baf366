#include "common/protocol/reasoning_parser.h"

#include <algorithm>

namespace pdserve {
namespace {

std::string_view trim_leading_newlines(std::string_view text) {
  size_t first = text.find_first_not_of('\n');
  return first == std::string_view::npos ? std::string_view() : text.substr(first);
}

std::string_view trim_trailing_newlines(std::string_view text) {
  size_t last = text.find_last_not_of('\n');
  return last == std::string_view::npos ? std::string_view() : text.substr(0, last + 1);
}

// Length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t partial_tag_length(std::string_view text, std::string_view tag) {
  for (size_t length = std::min(text.size(), tag.size() - 1); length > 0; --length) {
    if (text.substr(text.size() - length) == tag.substr(0, length)) return length;
  }
  return 0;
}

}  // namespace

ReasoningSplit split_reasoning(std::string_view text, bool starts_in_reasoning) {
  std::string_view region = text;
  if (!starts_in_reasoning) {
    if (!text.starts_with(kThinkStart)) return {std::nullopt, std::string(text)};
    region = text.substr(kThinkStart.size());
  }
  size_t end = region.find(kThinkEnd);
  if (end == std::string_view::npos) {
    return {std::string(trim_leading_newlines(region)), std::string()};
  }
  std::string_view reasoning = trim_trailing_newlines(trim_leading_newlines(region.substr(0, end)));
  std::string_view content = trim_leading_newlines(region.substr(end + kThinkEnd.size()));
  return {std::string(reasoning), std::string(content)};
}

bool prompt_ends_in_reasoning(std::string_view prompt) {
  size_t open = prompt.rfind(kThinkStart);
  if (open == std::string_view::npos) return false;
  return prompt.find(kThinkEnd, open) == std::string_view::npos;
}

ReasoningParser::ReasoningParser(bool starts_in_reasoning)
    : state_(starts_in_reasoning ? State::kReasoningLeading : State::kDetectStart),
      has_reasoning_(starts_in_reasoning) {}

ReasoningDelta ReasoningParser::push(std::string_view piece) {
  pending_.append(piece);
  ReasoningDelta delta;
  run(delta);
  return delta;
}

void ReasoningParser::run(ReasoningDelta& delta) {
  while (!pending_.empty()) {
    switch (state_) {
      case State::kDetectStart:
        if (pending_.size() < kThinkStart.size() && kThinkStart.starts_with(pending_)) return;
        if (pending_.starts_with(kThinkStart)) {
          pending_.erase(0, kThinkStart.size());
          has_reasoning_ = true;
          state_ = State::kReasoningLeading;
        } else {
          state_ = State::kContent;
        }
        break;
      case State::kReasoningLeading:
      case State::kContentLeading: {
        size_t first = pending_.find_first_not_of('\n');
        pending_.erase(0, first);  // npos erases everything
        if (first == std::string::npos) return;
        state_ = state_ == State::kReasoningLeading ? State::kReasoning : State::kContent;
        break;
      }
      case State::kReasoning: {
        size_t end = pending_.find(kThinkEnd);
        if (end != std::string::npos) {
          delta.reasoning += trim_trailing_newlines(std::string_view(pending_).substr(0, end));
          pending_.erase(0, end + kThinkEnd.size());
          state_ = State::kContentLeading;
          break;
        }
        // Hold back a possible partial "</think>" and the newlines before it, which are
        // trimmed if the tag completes.
        size_t held_from = pending_.size() - partial_tag_length(pending_, kThinkEnd);
        while (held_from > 0 && pending_[held_from - 1] == '\n') --held_from;
        delta.reasoning.append(pending_, 0, held_from);
        pending_.erase(0, held_from);
        return;
      }
      case State::kContent:
        delta.content += pending_;
        pending_.clear();
        return;
    }
  }
}

ReasoningDelta ReasoningParser::finish() {
  ReasoningDelta delta;
  if (state_ == State::kReasoning) {
    delta.reasoning = std::move(pending_);
  } else if (state_ == State::kDetectStart) {
    delta.content = std::move(pending_);
  }
  pending_.clear();
  return delta;
}

}  // namespace pdserve
