#include "common/protocol/chat_prompt.h"

namespace pdserve {

nlohmann::ordered_json chat_template_context(const GenerationRequest& request) {
  nlohmann::ordered_json context = request.chat_template_kwargs;
  context["messages"] = request.messages;
  if (!request.tools.is_null()) context["tools"] = request.tools;
  if (!context.contains("add_generation_prompt")) context["add_generation_prompt"] = true;
  return context;
}

ApiResult<std::string> render_chat_prompt(const GenerationRequest& request,
                                          const ChatTemplate& chat_template) {
  Result<std::string> prompt = chat_template.render(chat_template_context(request));
  if (!prompt.ok()) {
    ApiError error = api_error_from_status(prompt.status());
    if (error.http_status == 400) {
      error.message = "The chat template could not render the messages: " + error.message;
      error.param = "messages";
    }
    return error;
  }
  return std::move(prompt).value();
}

}  // namespace pdserve
