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
// The incremental parser's content and completed calls concatenate to exactly the whole-text
// split however the text is cut into pieces, and what it has emitted after a prefix depends on
// that prefix only (so a resumed stream can replay its text). For a stream it also emits each
// call as it arrives (vLLM's hermes parser does the same), in fragments: the first announces the
// call (its index and name) as soon as the name's string has closed, with the arguments' text
// read so far; later ones carry the next bytes of that text as they arrive. The fragments of a
// call that completes concatenate to its `arguments`. Held back: a possible partial
// "<tool_call>" in text, whitespace after a call, a possible partial "</tool_call>" (it may end
// the block), and an incomplete UTF-8 sequence at the end of the arguments read so far.
// A block is content from the byte where it can no longer be a call (ToolCallBodyScanner) or
// when its "</tool_call>" or the end shows it is none; all of it then goes out as content,
// "<tool_call>" included, as in the whole answer. A call already announced stays in the stream
// as the client has it: nothing can be taken back, so its fragments are then not valid
// arguments, it is not among the completed calls, and the next call takes the next index.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/protocol/tool_call_scanner.h"

namespace pdserve {

inline constexpr std::string_view kToolCallStart = "<tool_call>";
inline constexpr std::string_view kToolCallEnd = "</tool_call>";

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // the JSON object's text as the model wrote it

  bool operator==(const ParsedToolCall&) const = default;
};

// A streamed call's part: the first one of a call announces it, with its name.
struct ToolCallFragment {
  int index = 0;                    // among the calls the stream has announced, from 0
  std::optional<std::string> name;  // on the call's first fragment only
  std::string arguments;            // the next bytes of the arguments' JSON text

  bool operator==(const ToolCallFragment&) const = default;
};

struct ToolCallDelta {
  std::string content;
  std::vector<ToolCallFragment> fragments;  // for a stream: at most one per call, in order
  std::vector<ParsedToolCall> calls;        // completed in this piece, in order
};

// The call between the tags (`body` excludes them), or nullopt when it is not one.
std::optional<ParsedToolCall> parse_tool_call(std::string_view body);

class ToolCallParser {
 public:
  ToolCallDelta push(std::string_view piece);
  // Ends the stream: releases what was held back (an unterminated call as content).
  ToolCallDelta finish();

  // Calls completed so far.
  int num_calls() const { return num_calls_; }

 private:
  enum class State {
    kText,       // content, up to a "<tool_call>"
    kAfterCall,  // whitespace after a call is dropped
    kCall,       // a block that may still be a call
    kNotACall,   // a block that is none: content up to and including its "</tool_call>"
  };

  void run(ToolCallDelta& delta);
  // kCall: reads the block as far as it has arrived; false when it is still open.
  bool read_call(ToolCallDelta& delta);
  // The announced call's arguments read so far and not sent yet.
  void send_arguments(ToolCallDelta& delta);
  void add_fragment(ToolCallDelta& delta, std::optional<std::string> name,
                    std::string_view arguments);
  // The block is not a call: it becomes content, from its start tag on.
  void give_up_call(ToolCallDelta& delta);

  State state_ = State::kText;
  // kText: a possible partial start tag; kCall: the block after its tag; kNotACall: the rest of
  // the block not yet sent, from a possible partial end tag on.
  std::string pending_;
  size_t end_scan_from_ = 0;  // kCall, kNotACall: where the search for the end tag resumes
  // kCall: the block's body as read so far, how much of it, the announced call's index, and
  // the bytes of its arguments sent.
  ToolCallBodyScanner scanner_;
  size_t scanned_ = 0;
  std::optional<int> announced_index_;
  size_t arguments_sent_ = 0;
  int num_announced_ = 0;
  int num_calls_ = 0;
};

// The whole-text split: push(text) then finish().
ToolCallDelta split_tool_calls(std::string_view text);

}  // namespace pdserve
