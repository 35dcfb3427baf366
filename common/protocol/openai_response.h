// OpenAI response bodies for /v1/completions and /v1/chat/completions, whole and as SSE chunks.
//
// Logprob values: JSON has no -inf, so a logprob below kMinSerializedLogprob (including -inf
// and NaN) is written as -9999.0, as vLLM does. Token strings may be partial UTF-8 (a byte-level
// token in the middle of a character): the completions "tokens" / top_logprobs keys and the
// chat "token" fields then use OpenAI's "bytes:\xe4\xbd" spelling, and chat "bytes" carries the
// exact bytes. Every dump replaces invalid UTF-8 instead of throwing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/sampling/stop_checker.h"

namespace pdserve {

inline constexpr double kMinSerializedLogprob = -9999.0;

// The shared envelope fields: id ("cmpl-..." / "chatcmpl-..."), created (Unix seconds), model.
struct ResponseMeta {
  std::string id;
  int64_t created = 0;
  std::string model;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};

struct TopLogprob {
  std::string token;  // the token's raw bytes
  float logprob = 0.0f;
};

// One position: the chosen token, its logprob (nullopt for the first echoed prompt token, which
// has no logprob), and the alternatives.
struct OutputTokenLogprob {
  std::string token;
  std::optional<float> logprob;
  std::vector<TopLogprob> top;
};

// Completion logprobs {tokens, token_logprobs, top_logprobs, text_offset}; text_offset counts
// Unicode code points (as vLLM's Python len does) from text_offset_start, the length of the text
// before the first of these tokens (the echoed prompt or earlier stream chunks).
nlohmann::ordered_json completion_logprobs_json(const std::vector<OutputTokenLogprob>& tokens,
                                                int64_t text_offset_start);
// Chat logprobs {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}.
nlohmann::ordered_json chat_logprobs_json(const std::vector<OutputTokenLogprob>& tokens);

// vLLM's prompt_logprobs for one prompt position after the first: the prompt token first,
// then the alternatives that are not it, each with its logprob, rank and text.
struct PromptPositionLogprobs {
  struct Entry {
    int32_t token = 0;
    float logprob = 0.0f;
    int rank = 1;
    std::string text;  // the token's raw bytes
  };
  std::vector<Entry> entries;
};
// [null, {"<token id>": {"logprob", "rank", "decoded_token"}, ...}, ...]: null for the first
// prompt token, then one object per position.
nlohmann::ordered_json prompt_logprobs_json(const std::vector<PromptPositionLogprobs>& positions);

struct CompletionChoice {
  int index = 0;  // prompt_index * n + sample_index
  std::string text;
  std::optional<std::vector<OutputTokenLogprob>> logprobs;
  int64_t text_offset_start = 0;
  FinishReason finish_reason = FinishReason::kNone;
  // vLLM's prompt_logprobs of the choice's prompt (whole answers only), when asked.
  std::optional<std::vector<PromptPositionLogprobs>> prompt_logprobs;
};

// A function call the model made: {"id", "type": "function", "function": {"name",
// "arguments"}}.
struct ChatToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text
};

// A call's part in a stream chunk (an entry of delta.tool_calls): the first one of a call is
// {"index", "id", "type": "function", "function": {"name", "arguments"}}, the next ones
// {"index", "function": {"arguments"}}; their arguments concatenate to the call's.
struct ChatToolCallDelta {
  int index = 0;  // the call's position among the choice's calls
  struct Header {
    std::string id;
    std::string name;
  };
  std::optional<Header> header;  // on the call's first part only
  std::string arguments;         // the next bytes of the arguments' JSON text
};

// With tool calls, finish_reason is "tool_calls" whatever ended the generation (as vLLM), and
// an empty content is null (as OpenAI).
struct ChatChoice {
  int index = 0;
  std::string content;
  std::optional<std::string> reasoning_content;
  std::optional<std::vector<OutputTokenLogprob>> logprobs;
  FinishReason finish_reason = FinishReason::kNone;
  std::vector<ChatToolCall> tool_calls;
  // The stop string that ended the answer: vLLM's "stop_reason" (written only when set).
  std::string matched_stop;
};

// {"id", "object": "text_completion", "created", "model", "choices": [{index, text, logprobs,
// finish_reason, prompt_logprobs (when asked)}], "usage": {prompt_tokens, completion_tokens,
// total_tokens}}.
nlohmann::ordered_json completion_response(const ResponseMeta& meta,
                                           const std::vector<CompletionChoice>& choices,
                                           const Usage& usage);
// {"id", "object": "chat.completion", "created", "model", "choices": [{index, message: {role,
// content, reasoning_content (only when present), tool_calls (only when present)}, logprobs,
// finish_reason}], "usage"}, and "prompt_logprobs" when given (vLLM: once, for the prompt).
nlohmann::ordered_json chat_completion_response(
    const ResponseMeta& meta, const std::vector<ChatChoice>& choices, const Usage& usage,
    const std::optional<std::vector<PromptPositionLogprobs>>& prompt_logprobs = std::nullopt);

// Streaming. Each chunk carries "usage": null when the client asked for include_usage (as
// OpenAI does); the usage itself comes in a last chunk with "choices": [].
struct StreamOptions {
  bool include_usage = false;
};

// A text_completion chunk for one choice: text, optional logprobs, finish_reason or null.
nlohmann::ordered_json completion_chunk(const ResponseMeta& meta, const StreamOptions& options,
                                        const CompletionChoice& choice);
// chat.completion.chunk with delta {"role": "assistant", "content": ""}: the first chunk of
// every choice.
nlohmann::ordered_json chat_role_chunk(const ResponseMeta& meta, const StreamOptions& options,
                                       int index);
// chat.completion.chunk with delta {reasoning_content?, content?, tool_calls?} (fields only
// when not empty) and optional logprobs; finish_reason null.
nlohmann::ordered_json chat_delta_chunk(const ResponseMeta& meta, const StreamOptions& options,
                                        int index, std::string_view reasoning,
                                        std::string_view content,
                                        const std::vector<OutputTokenLogprob>* logprobs,
                                        const std::vector<ChatToolCallDelta>& tool_calls = {});
// The last chunk of a choice: empty delta and its finish_reason ("tool_calls" when the choice
// called a tool), and vLLM's "stop_reason" when a stop string ended it.
nlohmann::ordered_json chat_finish_chunk(const ResponseMeta& meta, const StreamOptions& options,
                                         int index, FinishReason reason, bool called_tools = false,
                                         std::string_view matched_stop = {});
// The usage chunk: "choices": [] and "usage": {...}; `chat` picks the object name.
nlohmann::ordered_json usage_chunk(const ResponseMeta& meta, bool chat, const Usage& usage);

// "data: <compact json>\n\n".
std::string sse_event(const nlohmann::ordered_json& payload);
// "data: [DONE]\n\n".
std::string sse_done();

// Compact JSON with invalid UTF-8 replaced by U+FFFD (never throws).
std::string to_json_text(const nlohmann::ordered_json& value);

}  // namespace pdserve
