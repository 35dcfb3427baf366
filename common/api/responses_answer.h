// A chat completion's answer as the Responses API's: the response object (output items:
// reasoning, then the message, then function_call items; usage; status "completed", or
// "incomplete" with reason max_output_tokens when the length limit ended it), and for streams
// its typed events, each with a sequence_number:
//   response.created, response.in_progress,
//   per output item: response.output_item.added, then
//     reasoning: response.reasoning_text.delta ... response.reasoning_text.done
//     message: response.content_part.added, response.output_text.delta ...,
//              response.output_text.done, response.content_part.done
//     function_call: response.function_call_arguments.delta ...,
//                    response.function_call_arguments.done
//   response.output_item.done, and last response.completed (or response.incomplete), or
//   response.failed when the chat stream failed.
// Errors keep OpenAI's shape; the param of a chat field is the Responses field's name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/api/chat_answer_translator.h"

namespace pdserve::api {

class ResponsesAnswer final : public ChatAnswerTranslator {
 public:
  // `echo`: the request fields the response object repeats (ResponsesRequest::echo).
  explicit ResponsesAnswer(nlohmann::ordered_json echo) : echo_(std::move(echo)) {}

  http::HttpResponse whole(const nlohmann::json& completion) override;
  http::HttpResponse error(int status, const nlohmann::json& body) override;
  std::string chunk(const nlohmann::json& chunk) override;
  std::string stream_error(const nlohmann::json& body) override;
  std::string done() override;

 private:
  enum class ItemKind { kReasoning, kMessage, kFunctionCall };
  struct Item {
    ItemKind kind;
    std::string id;
    std::string text;  // reasoning or message text, or the call's arguments
    std::string call_id;
    std::string name;
  };

  void take_meta(const nlohmann::json& chat);
  nlohmann::ordered_json response_object(std::string_view status) const;
  static nlohmann::ordered_json item_json(const Item& item, std::string_view status);
  std::string event(std::string_view type, nlohmann::ordered_json payload);
  std::string start();
  // Opens a new output item of `kind` (closing the open one) unless that kind is open.
  std::string open_item(ItemKind kind, std::string call_id = {}, std::string name = {});
  std::string close_item();
  std::string item_id(ItemKind kind, const std::string& call_id) const;

  const nlohmann::ordered_json echo_;
  std::string id_ = "resp_unknown";
  std::string serial_ = "unknown";  // the chat id without its "chatcmpl-"
  int64_t created_at_ = 0;
  std::string model_;
  std::vector<Item> items_;
  std::optional<size_t> open_;      // the output index of the item being streamed
  std::vector<size_t> call_items_;  // the output index of each tool call, by its chat index
  std::optional<std::string> finish_reason_;
  nlohmann::ordered_json usage_ = nullptr;
  nlohmann::ordered_json error_ = nullptr;
  int64_t sequence_ = 0;
  bool started_ = false;
  bool ended_ = false;
};

}  // namespace pdserve::api
