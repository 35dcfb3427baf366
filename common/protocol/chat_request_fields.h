// The chat-only fields of a /v1/chat/completions request: messages (content parts, tool calls
// and their arguments), tools, tool_choice, chat_template_kwargs and the prompt's shape
// (add_generation_prompt, continue_final_message). Throw RequestError naming the field.
#pragma once

#include <string>

#include "common/protocol/openai_request.h"
#include "common/protocol/request_fields.h"

namespace pdserve::request_fields {

Json read_message(const Json& message, const std::string& param);
Json read_tools(const Json& tools);
void read_tool_choice(ObjectReader& reader, GenerationRequest& request);
void read_chat_template_kwargs(ObjectReader& reader, GenerationRequest& request);
void read_chat_prompt_shape(ObjectReader& reader, GenerationRequest& request);

}  // namespace pdserve::request_fields
