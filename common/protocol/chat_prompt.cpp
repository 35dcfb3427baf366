#include "common/protocol/chat_prompt.h"

namespace pdserve {
namespace {

// transformers' continue_final_message: the prompt ends right after the last message's
// content, without the template's end-of-turn, so that the model goes on with that message.
ApiResult<std::string> cut_after_final_message(const GenerationRequest& request,
                                               const std::string& prompt) {
  const std::string& content = request.messages.back()["content"].get_ref<const std::string&>();
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  const size_t first = content.find_first_not_of(kSpace);
  if (first == std::string::npos) return prompt;  // nothing to find: the whole render
  const std::string_view stripped =
      std::string_view(content).substr(first, content.find_last_not_of(kSpace) - first + 1);
  const size_t at = prompt.rfind(stripped);
  if (at == std::string::npos) {
    return invalid_request(
        "continue_final_message is set but the final message does not appear in the prompt the "
        "chat template rendered.",
        "continue_final_message");
  }
  const std::string_view left_stripped = std::string_view(content).substr(first);
  // Where the template kept the message's trailing space, the prompt keeps it too.
  const bool kept = prompt.compare(at, left_stripped.size(), left_stripped) == 0;
  return prompt.substr(0, at + (kept ? left_stripped.size() : stripped.size()));
}

}  // namespace

nlohmann::ordered_json chat_template_context(const GenerationRequest& request) {
  nlohmann::ordered_json context = request.chat_template_kwargs;
  context["messages"] = request.messages;
  if (!request.tools.is_null()) context["tools"] = request.tools;
  context["add_generation_prompt"] = request.add_generation_prompt;
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
  if (request.continue_final_message) return cut_after_final_message(request, prompt.value());
  return std::move(prompt).value();
}

}  // namespace pdserve
