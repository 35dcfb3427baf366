// Renders a chat request into the prompt text with the model's chat template.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/chat/chat_template.h"
#include "common/protocol/openai_error.h"
#include "common/protocol/openai_request.h"

namespace pdserve {

// The template variables, in this order: the chat_template_kwargs (enable_thinking, ...), then
// messages, tools (when the request has any, in the client's key order) and
// add_generation_prompt (the request's, which a kwarg of that name already overrode). kwargs
// cannot replace messages or tools (rejected at parse).
nlohmann::ordered_json chat_template_context(const GenerationRequest& request);

// The rendered prompt. A template error (e.g. Qwen3's "No user query found in messages.") is
// the client's doing: 400 with the template's message. With continue_final_message the prompt
// ends right after the last message's content (transformers' rule; 400 when the template did
// not render that content).
ApiResult<std::string> render_chat_prompt(const GenerationRequest& request,
                                          const ChatTemplate& chat_template);

}  // namespace pdserve
