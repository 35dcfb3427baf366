// POST /v1/messages (Anthropic's Messages API) as a chat completion request:
//   system (a string or text blocks: the first message), messages (user / assistant; content
//   a string or blocks: text, tool_use (assistant: its tool_calls), tool_result (user: a tool
//   message each, before the user's text), thinking (assistant: its reasoning_content;
//   redacted_thinking is dropped)), max_tokens (required), stop_sequences, temperature, top_p,
//   top_k, tools ({name, description, input_schema}), tool_choice (auto, any -> required, tool
//   -> that function, none), thinking ({type: enabled | disabled}: the template's
//   enable_thinking), output_config.format (json_schema: the chat path's grammar), stream,
//   metadata and the other fields of Anthropic's platform (ignored); other fields (the chat
//   path's extensions) pass through unchanged. Images, documents and server tools are a 400 naming
//   the field.
// POST /v1/messages/count_tokens takes the same body without max_tokens: its chat request is
// the /tokenize body of the same prompt.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/protocol/openai_error.h"

namespace pdserve::api {

struct MessagesRequest {
  nlohmann::ordered_json chat;  // the /v1/chat/completions (or /tokenize) body
  bool stream = false;
};

enum class MessagesEndpoint { kCreate, kCountTokens };

ApiResult<MessagesRequest> translate_messages_request(std::string_view body,
                                                      MessagesEndpoint endpoint);

// The Messages API's name for a chat request field ("max_completion_tokens" -> "max_tokens",
// "stop" -> "stop_sequences"); `chat_param` itself when it has the same name.
std::string messages_param(std::string_view chat_param);

}  // namespace pdserve::api
