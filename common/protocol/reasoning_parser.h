// Splits Qwen3 output into reasoning_content (the <think>...</think> part) and content, for a
// whole text and incrementally for streaming deltas.
//
// Rules (those of vLLM's Qwen3 reasoning parser, plus the newline trimming that Qwen3's own
// chat template applies when it renders reasoning_content back into a prompt):
//  * The reasoning part starts at offset 0 when the prompt already ends inside a think block
//    (see prompt_ends_in_reasoning), or right after a "<think>" that opens the output.
//    Otherwise there is no reasoning and the whole output is content, byte for byte.
//  * It ends at the first "</think>"; without one (e.g. a length cut), everything is reasoning.
//  * Newlines are trimmed at the start of the reasoning, at its end before "</think>", and at
//    the start of the content after "</think>" (the template writes "<think>\n" ...
//    "\n</think>\n\n").
// The incremental parser's deltas concatenate to exactly the whole-text split, however the
// text is cut into pieces; it holds back only a possible partial tag and trailing newlines.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace pdserve {

inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";

struct ReasoningSplit {
  std::optional<std::string> reasoning;  // nullopt when the output has no reasoning part
  std::string content;
};

ReasoningSplit split_reasoning(std::string_view text, bool starts_in_reasoning);

// True when the last "<think>" of a rendered prompt is not closed by a later "</think>", i.e.
// the model's output continues inside the think block (thinking templates that open it).
bool prompt_ends_in_reasoning(std::string_view prompt);

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  explicit ReasoningParser(bool starts_in_reasoning);

  ReasoningDelta push(std::string_view piece);
  // Ends the stream: releases what was held back.
  ReasoningDelta finish();

  // Whether the output has a reasoning part (known once "<think>" or other text has arrived).
  bool has_reasoning() const { return has_reasoning_; }

 private:
  enum class State { kDetectStart, kReasoningLeading, kReasoning, kContentLeading, kContent };

  void run(ReasoningDelta& delta);

  State state_;
  bool has_reasoning_;
  std::string pending_;
};

}  // namespace pdserve
