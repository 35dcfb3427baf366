// What the Responses and Anthropic Messages front ends translate: a chat completion's answer
// (whole, streamed or an error, as the serving node or the proxy writes it) into their own
// API's answer. One translator serves one request; TranslatingChannel (translating_channel.h)
// calls it in the answer's order.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/http/http_message.h"

namespace pdserve::api {

class ChatAnswerTranslator {
 public:
  virtual ~ChatAnswerTranslator() = default;

  // A whole chat.completion (HTTP 200) as the API's response.
  virtual http::HttpResponse whole(const nlohmann::json& completion) = 0;
  // An error answer (`status` >= 400, OpenAI's {"error": {...}} body) in the API's shape.
  virtual http::HttpResponse error(int status, const nlohmann::json& body) = 0;

  // Streams: the SSE bytes to send for one chat.completion.chunk (maybe none), for an error
  // event ({"error": {...}}: the stream failed; nothing follows but [DONE]) and for [DONE].
  virtual std::string chunk(const nlohmann::json& chunk) = 0;
  virtual std::string stream_error(const nlohmann::json& body) = 0;
  virtual std::string done() = 0;
};

}  // namespace pdserve::api
