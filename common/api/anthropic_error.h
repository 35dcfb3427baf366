// Anthropic's error shape, {"type": "error", "error": {"type", "message"}}, for the Messages
// API's answers: its error type for an HTTP status (400 invalid_request_error, 401
// authentication_error, 403 permission_error, 404 not_found_error, 413 request_too_large,
// 429 rate_limit_error, 503 / 529 overloaded_error, anything else api_error).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/http/http_message.h"
#include "common/protocol/openai_error.h"

namespace pdserve::api {

std::string_view anthropic_error_type(int http_status);
nlohmann::ordered_json anthropic_error_body(int http_status, std::string_view message);
// The response for `error` (its status, Retry-After, and WWW-Authenticate for a 401).
http::HttpResponse anthropic_error_response(const ApiError& error);

}  // namespace pdserve::api
