// POST /v1/responses as a chat completion request (OpenAI's Responses API, stateless):
//   input (a string, or a list of messages {role, content: string | [input_text, output_text
//   parts]}, function_call and function_call_output items; reasoning items are dropped),
//   instructions (a system message first), max_output_tokens, temperature, top_p, tools
//   (function tools), tool_choice, parallel_tool_calls, text.format (text, json_object,
//   json_schema: the chat path's grammar), stream, and the chat path's own extensions (top_k,
//   seed, ...), which pass through unchanged.
// Refused with a 400 naming the field: store: true and previous_response_id (nothing is
// stored), background: true, non-function tools, non-text input parts (images, files).
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "common/protocol/openai_error.h"

namespace pdserve::api {

struct ResponsesRequest {
  nlohmann::ordered_json chat;  // the /v1/chat/completions body
  // The request fields a response object repeats (instructions, max_output_tokens, tools,
  // text, ...), with the API's defaults where the request had none.
  nlohmann::ordered_json echo;
  bool stream = false;
};

ApiResult<ResponsesRequest> translate_responses_request(std::string_view body);

// The request field of the Responses API that a chat request field came from ("messages" ->
// "input"), for the chat path's errors; `param` itself when it has the same name.
std::string responses_param(std::string_view chat_param);

}  // namespace pdserve::api
