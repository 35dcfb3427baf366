// POST /v1/messages/count_tokens answered from /tokenize: {"count": N, ...} becomes
// {"input_tokens": N}; errors are Anthropic's shape. Not a stream.
#pragma once

#include <string>

#include "common/api/chat_answer_translator.h"

namespace pdserve::api {

class CountTokensAnswer final : public ChatAnswerTranslator {
 public:
  http::HttpResponse whole(const nlohmann::json& tokenized) override;
  http::HttpResponse error(int status, const nlohmann::json& body) override;
  // /tokenize never streams: these are never called with anything to translate.
  std::string chunk(const nlohmann::json&) override { return {}; }
  std::string stream_error(const nlohmann::json&) override { return {}; }
  std::string done() override { return {}; }
};

}  // namespace pdserve::api
