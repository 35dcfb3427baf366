// Parsing and validation of OpenAI requests (POST /v1/completions, POST /v1/chat/completions)
// into an engine-facing GenerationRequest. Pure functions: no sockets, no engine.
//
// Policy (documented choices where OpenAI and vLLM differ):
//  * Unknown top-level fields are ignored and listed in GenerationRequest::ignored_fields (the
//    server logs them once per request), as vLLM does, so that clients on newer SDKs keep
//    working; with strict_fields (--strict-request-fields) they are a 400 "Unrecognized request
//    argument supplied: <name>" as in OpenAI. Unknown fields inside messages, content parts,
//    tool calls, tools and stream_options are always a 400, where vLLM ignores them (logging
//    those of stream_options, silently for messages): a misspelled field of a message
//    ("contnet", "tool_call_idd") would otherwise change the prompt without a trace, and the
//    SDKs only ever add fields at the top level.
//  * OpenAI fields accepted, type-checked and ignored (they change nothing here): store,
//    metadata, reasoning_effort, service_tier, priority, parallel_tool_calls, user.
//  * OpenAI fields pdserve does not implement are accepted only with their neutral value
//    (best_of: 1, suffix: null) and rejected otherwise, so no request is answered as if a
//    feature were applied.
//  * logit_bias: {"<token id>": bias in [-100, 100]} (out of range: 400, where vLLM clamps).
//  * The "developer" role is the "system" role (OpenAI's newer name).
//  * Structured outputs: response_format (json_object, json_schema: enforced whatever
//    "strict" says), guided_json / guided_regex / guided_choice / guided_grammar and
//    structured_outputs (vLLM) become one StructuredOutput in sampling.structured_output,
//    checked by xgrammar here (400 naming the field when it refuses one); more than one is a
//    400 (vLLM too refuses several). tool_choice "required" or a named function constrains the
//    output to Qwen3's hermes tool calls of the allowed tools (vLLM constrains a named one to
//    its arguments JSON; pdserve keeps the <tool_call> format the chat template teaches, which
//    the tool-call parser reads back).
//  * JSON null means "not set" for every optional field.
//  * Integer fields must be integral JSON numbers (5 or 5.0, not 5.5 or "5").
//  * stop: a string or a list of at most kMaxStopStrings non-empty strings (OpenAI allows 4,
//    vLLM any number; 16 keeps per-token matching cheap and accepts what vLLM clients send),
//    each at most kMaxStopStringBytes bytes.
//  * n: 1..kMaxChoices (128, OpenAI's limit). logprobs (completions) and top_logprobs (chat):
//    0..20 (vLLM's default max_logprobs). max_tokens >= 1 (no echo-only requests).
//  * model may be absent (vLLM: the served model); the server checks the name.
//  * The body may nest at most kMaxJsonDepth levels (checked before parsing).
//  * Tools (as vLLM with the hermes parser): tools are rendered into the prompt whatever
//    tool_choice says (vLLM's default); "auto" (the default) parses the answer's tool calls
//    (tool_call_parser.h), "none" does not; "required" and a named function need constrained
//    decoding and are rejected. The arguments string of an assistant tool call reaches the
//    template as the object it holds (vLLM's json.loads), otherwise as the string.
// vLLM extensions accepted: min_tokens, top_k, min_p, repetition_penalty, stop_token_ids,
// ignore_eos, include_stop_str_in_output, skip_special_tokens, chat_template_kwargs,
// stream_options.continuous_usage_stats, chat echo / add_generation_prompt /
// continue_final_message, reasoning_content in assistant messages, and the guided_* /
// structured_outputs fields.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/core/json_depth.h"
#include "common/protocol/openai_error.h"
#include "common/sampling/sampling_params.h"

namespace pdserve {

inline constexpr int kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 1024;
inline constexpr int kMaxChoices = 128;
// OpenAI's (and vLLM's) default max_tokens for /v1/completions.
inline constexpr int kDefaultCompletionMaxTokens = 16;

enum class ApiEndpoint { kCompletions, kChatCompletions };

// One completion prompt: text, or token ids given by the client.
struct Prompt {
  std::string text;
  std::vector<int32_t> token_ids;
  bool is_token_ids = false;
};

struct GenerationRequest {
  ApiEndpoint endpoint = ApiEndpoint::kCompletions;
  std::string model;  // "" when the client left it out

  // /v1/completions: one or more prompts; each yields n choices.
  std::vector<Prompt> prompts;

  // /v1/chat/completions, normalized for the chat template: content is always a string (text
  // parts joined with "\n"), and the arguments of assistant tool_calls are the object their
  // JSON string holds (as vLLM gives templates); tools is null or the client's list in the
  // client's key order.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;
  // "none", "auto", "required" or "function" (a named one: tool_choice_function). The last
  // two set sampling.structured_output to the tools' hermes tool calls.
  std::string tool_choice = "auto";
  std::string tool_choice_function;
  // Whether the answer's content is parsed for tool calls (common/protocol/tool_call_parser.h):
  // the request has tools and tool_choice is not "none".
  bool parses_tool_calls() const;
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  bool enable_thinking = true;  // chat_template_kwargs.enable_thinking (Qwen3's default: on)

  // Sampling values the request gave. The five fields of `requested_defaults` (temperature,
  // top_p, top_k, min_p, repetition_penalty) are left at their built-in values in `sampling`
  // and resolved against the model's generation_config by resolved_sampling().
  // sampling.want_logprobs / sampling.logprobs carry logprobs (completions) or
  // logprobs + top_logprobs (chat).
  SamplingParams sampling;
  SamplingDefaults requested_defaults;
  // vLLM's prompt_logprobs as the client gave it. sampling.prompt_logprobs is what the engine
  // computes: this, or, for a completion's echo with logprobs, the larger of the two counts.
  std::optional<int> prompt_logprobs;
  std::optional<int> max_tokens;  // max_completion_tokens, else max_tokens; see resolve_max_tokens

  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  int n = 1;
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
  bool continuous_usage_stats = false;  // stream_options.continuous_usage_stats
  // Completions: the prompt comes first. Chat: the last message's content comes first when it
  // has the answer's role (assistant; vLLM's rule).
  bool echo = false;
  bool add_generation_prompt = true;    // chat: the template opens the assistant's turn
  bool continue_final_message = false;  // chat: the answer continues the last (assistant) message
  std::string user;
  std::vector<std::string> ignored_fields;  // unknown top-level fields (not strict)

  // The final SamplingParams: requested values, then generation_config defaults (vLLM's rule),
  // with the given max_tokens (from resolve_max_tokens). 400 when the result is invalid.
  ApiResult<SamplingParams> resolved_sampling(const SamplingDefaults& generation_config,
                                              int resolved_max_tokens, int vocab_size) const;
};

// Parses a request body. Malformed JSON, a body nested deeper than kMaxJsonDepth, or a body
// that is not a JSON object -> 400 naming the byte position where possible.
ApiResult<nlohmann::ordered_json> parse_json_body(std::string_view body);

// Validates a parsed body. vocab_size bounds prompt token ids and stop_token_ids. Unknown
// top-level fields go to GenerationRequest::ignored_fields, or with strict_fields are a 400
// (unknown fields inside messages, tools or stream_options always are).
ApiResult<GenerationRequest> parse_completion_request(const nlohmann::ordered_json& body,
                                                      int vocab_size, bool strict_fields = false);
ApiResult<GenerationRequest> parse_chat_completion_request(const nlohmann::ordered_json& body,
                                                           int vocab_size,
                                                           bool strict_fields = false);

// POST /tokenize (vLLM's shapes): {"prompt": text} or a chat body ({"messages": [...]} with the
// chat fields that shape the prompt: tools, chat_template_kwargs, add_generation_prompt,
// continue_final_message), plus "model", "add_special_tokens" (accepted; Qwen3's tokenizer
// adds none) and "return_token_strs". Answered {"count", "max_model_len", "tokens",
// "token_strs"}.
struct TokenizeRequest {
  std::string model;
  std::optional<std::string> prompt;  // the completion form
  GenerationRequest chat;             // the chat form, when prompt is unset
  bool return_token_strs = false;
  std::vector<std::string> ignored_fields;
};
ApiResult<TokenizeRequest> parse_tokenize_request(const nlohmann::ordered_json& body,
                                                  int vocab_size, bool strict_fields = false);

// POST /detokenize: {"tokens": [ids], "model"} -> {"prompt": text}.
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
  std::vector<std::string> ignored_fields;
};
ApiResult<DetokenizeRequest> parse_detokenize_request(const nlohmann::ordered_json& body,
                                                      int vocab_size, bool strict_fields = false);

// The max_tokens to generate for one prompt of prompt_tokens tokens in a model of
// max_model_len tokens (vLLM's rules and messages):
//  * prompt_tokens >= max_model_len -> 400 (code "context_length_exceeded");
//  * an explicit max_tokens with prompt_tokens + max_tokens > max_model_len -> 400;
//  * unset: chat -> max_model_len - prompt_tokens; completions -> 16, capped to what is left;
//  * min_tokens above the result -> 400.
ApiResult<int> resolve_max_tokens(const GenerationRequest& request, int prompt_tokens,
                                  int max_model_len);

}  // namespace pdserve
