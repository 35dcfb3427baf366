#include "common/protocol/openai_error.h"

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

namespace pdserve {
namespace {

TEST(OpenAiError, InvalidRequestBody) {
  EXPECT_EQ(invalid_request("Invalid value for 'n': 0.", "n").body(),
            R"({"error":{"message":"Invalid value for 'n': 0.","type":"invalid_request_error",)"
            R"("param":"n","code":null}})");
  EXPECT_EQ(
      invalid_request("bad").body(),
      R"({"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}})");
  EXPECT_EQ(invalid_request("bad").http_status, 400);
}

TEST(OpenAiError, NotFoundMethodAndSizeErrors) {
  ApiError model = model_not_found("gpt-4");
  EXPECT_EQ(model.http_status, 404);
  EXPECT_EQ(
      model.body(),
      R"({"error":{"message":"The model `gpt-4` does not exist.","type":"invalid_request_error",)"
      R"("param":"model","code":"model_not_found"}})");
  ApiError route = route_not_found("POST", "/v1/nope");
  EXPECT_EQ(route.http_status, 404);
  EXPECT_EQ(route.message, "Invalid URL (POST /v1/nope)");
  ApiError method = method_not_allowed("GET", "/v1/completions");
  EXPECT_EQ(method.http_status, 405);
  EXPECT_EQ(method.message, "Method GET is not allowed for /v1/completions");
  ApiError size = payload_too_large(1024);
  EXPECT_EQ(size.http_status, 413);
  EXPECT_EQ(size.code, "request_too_large");
  EXPECT_NE(size.message.find("1024 bytes"), std::string::npos);
}

TEST(OpenAiError, OverloadCarriesRetryAfter) {
  ApiError busy = too_many_requests("The waiting queue is full.", 3);
  EXPECT_EQ(busy.http_status, 429);
  EXPECT_EQ(busy.retry_after_seconds, 3);
  EXPECT_EQ(busy.body(),
            R"({"error":{"message":"The waiting queue is full.","type":"rate_limit_error",)"
            R"("param":null,"code":"rate_limit_exceeded"}})");
  ApiError down = service_unavailable("No decode node is available.", 5);
  EXPECT_EQ(down.http_status, 503);
  EXPECT_EQ(down.type, "server_error");
  EXPECT_EQ(down.retry_after_seconds, 5);
  ApiError bug = internal_server_error("oops");
  EXPECT_EQ(bug.http_status, 500);
  EXPECT_FALSE(bug.retry_after_seconds);
}

TEST(OpenAiError, StatusMapping) {
  struct Case {
    Status status;
    int http_status;
    bool retry_after;
  };
  const Case cases[] = {
      {invalid_argument("a"), 400, false},    {out_of_range("a"), 400, false},
      {failed_precondition("a"), 400, false}, {unimplemented("a"), 400, false},
      {not_found("a"), 404, false},           {resource_exhausted("a"), 429, true},
      {unavailable("a"), 503, true},          {deadline_exceeded("a"), 503, true},
      {data_loss("a"), 500, false},           {internal_error("a"), 500, false},
      {Status::ok_status(), 500, false},
  };
  for (const Case& c : cases) {
    ApiError error = api_error_from_status(c.status);
    EXPECT_EQ(error.http_status, c.http_status) << c.status.to_string();
    EXPECT_EQ(error.retry_after_seconds.has_value(), c.retry_after) << c.status.to_string();
    if (!c.status.ok()) {
      EXPECT_EQ(error.message, "a");
    }
    // The body is always valid JSON of the OpenAI shape.
    auto body = nlohmann::json::parse(error.body());
    EXPECT_TRUE(body["error"].contains("message"));
    EXPECT_TRUE(body["error"].contains("type"));
    EXPECT_TRUE(body["error"].contains("param"));
    EXPECT_TRUE(body["error"].contains("code"));
  }
}

TEST(OpenAiError, InvalidUtf8InAMessageStillGivesValidJson) {
  ApiError error = invalid_request(std::string("bad byte \xff here"));
  auto body = nlohmann::json::parse(error.body());
  EXPECT_EQ(body["error"]["message"], "bad byte \xEF\xBF\xBD here");
}

TEST(OpenAiError, ReasonPhrases) {
  EXPECT_EQ(http_reason_phrase(400), "Bad Request");
  EXPECT_EQ(http_reason_phrase(405), "Method Not Allowed");
  EXPECT_EQ(http_reason_phrase(413), "Payload Too Large");
  EXPECT_EQ(http_reason_phrase(429), "Too Many Requests");
  EXPECT_EQ(http_reason_phrase(503), "Service Unavailable");
  EXPECT_EQ(http_reason_phrase(418), "Error");
}

TEST(OpenAiError, ApiResultHoldsAValueOrAnError) {
  ApiResult<int> value = 7;
  ASSERT_TRUE(value.ok());
  EXPECT_EQ(value.value(), 7);
  ApiResult<int> error = invalid_request("no");
  ASSERT_FALSE(error.ok());
  EXPECT_EQ(error.error().http_status, 400);
}

}  // namespace
}  // namespace pdserve
