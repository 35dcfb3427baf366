// Extracts Qwen3's tool calls from the content part of an answer (after the reasoning parser),
// for a whole text and incrementally for streaming deltas: the format of vLLM's `hermes` tool
// parser, which Qwen3's chat template asks the model to write:
//   <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>
//
// Rules:
//  * A call is the text between "<tool_call>" and the next "</tool_call>": after trimming
//    whitespace, one JSON object with exactly the members "name" (a non-empty string) and
//    "arguments" (an object), in either order, nesting at most kMaxJsonDepth levels.
//    `arguments` keeps the model's bytes of that object (JSON text, as OpenAI sends it).
//  * Anything else between the tags (bad JSON, other members, a string as arguments) and a
//    "<tool_call>" without its "</tool_call>" at the end of the output stays content, byte for
//    byte, tags included: malformed output is never an error. Each block is judged on its own.
//  * The name is not checked against the request's tools, as in vLLM: the client learns which
//    function the model wanted and decides.
//  * Text outside the blocks is content, except whitespace right after a call (the newlines
//    between calls and before the end of the turn).
// The incremental parser's output concatenates to exactly the whole-text split however the
// text is cut into pieces, and what it has emitted after a prefix depends on that prefix only
// (so a resumed stream can replay its text). It holds back a possible partial "<tool_call>",
// whitespace after a call, and a call until its "</tool_call>" arrives: only then is it known
// to be a call, so a call goes out whole.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pdserve {

inline constexpr std::string_view kToolCallStart = "<tool_call>";
inline constexpr std::string_view kToolCallEnd = "</tool_call>";

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // the JSON object's text as the model wrote it

  bool operator==(const ParsedToolCall&) const = default;
};

struct ToolCallDelta {
  std::string content;
  std::vector<ParsedToolCall> calls;  // completed in this piece, in order
};

// The call between the tags (`body` excludes them), or nullopt when it is not one.
std::optional<ParsedToolCall> parse_tool_call(std::string_view body);

class ToolCallParser {
 public:
  ToolCallDelta push(std::string_view piece);
  // Ends the stream: releases what was held back (an unterminated call as content).
  ToolCallDelta finish();

  // Calls found so far.
  int num_calls() const { return num_calls_; }

 private:
  enum class State { kText, kAfterCall, kCall };

  void run(ToolCallDelta& delta);

  State state_ = State::kText;
  std::string pending_;       // kText: a possible partial start tag; kCall: the block after its tag
  size_t end_scan_from_ = 0;  // kCall: where the search for the end tag resumes
  int num_calls_ = 0;
};

// The whole-text split: push(text) then finish().
ToolCallDelta split_tool_calls(std::string_view text);

}  // namespace pdserve
