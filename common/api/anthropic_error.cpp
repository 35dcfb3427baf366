#include "common/api/anthropic_error.h"

#include <string>

#include "common/http/api_error_response.h"

namespace pdserve::api {

std::string_view anthropic_error_type(int http_status) {
  switch (http_status) {
    case 400:
    case 405:
    case 422:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
    case 529:
      return "overloaded_error";
    default:
      return "api_error";
  }
}

nlohmann::ordered_json anthropic_error_body(int http_status, std::string_view message) {
  return {{"type", "error"},
          {"error", {{"type", anthropic_error_type(http_status)}, {"message", message}}}};
}

http::HttpResponse anthropic_error_response(const ApiError& error) {
  http::HttpResponse response = http::api_error_response(error);
  std::string message = error.message;
  // Anthropic's messages start with the field ("max_tokens: Field required").
  if (error.param && message.find(*error.param) == std::string::npos) {
    message = *error.param + ": " + message;
  }
  response.body = anthropic_error_body(error.http_status, message)
                      .dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return response;
}

}  // namespace pdserve::api
