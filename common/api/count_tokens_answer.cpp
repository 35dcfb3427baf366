#include "common/api/count_tokens_answer.h"

#include "common/api/anthropic_answer.h"

namespace pdserve::api {

http::HttpResponse CountTokensAnswer::whole(const nlohmann::json& tokenized) {
  const nlohmann::ordered_json out = {{"input_tokens", tokenized.value("count", int64_t{0})}};
  return {200, "application/json", {}, out.dump()};
}

http::HttpResponse CountTokensAnswer::error(int status, const nlohmann::json& body) {
  return AnthropicAnswer().error(status, body);
}

}  // namespace pdserve::api
