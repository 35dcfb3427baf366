// OpenAI-style API errors: the HTTP status and the JSON body
// {"error": {"message", "type", "param", "code"}} that the HTTP server and the proxy send back,
// plus the mapping from pdserve Status codes.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "common/core/status.h"

namespace pdserve {

struct ApiError {
  int http_status = 500;
  std::string message;
  std::string type;                        // "invalid_request_error", "server_error", ...
  std::optional<std::string> param;        // the offending request field, e.g. "messages[2].role"
  std::optional<std::string> code;         // e.g. "model_not_found"
  std::optional<int> retry_after_seconds;  // the Retry-After header value for 429 / 503

  // {"error": {"message": ..., "type": ..., "param": ... | null, "code": ... | null}}, compact.
  std::string body() const;
};

// 400: the request is malformed or a value is wrong; `param` names the field when there is one.
ApiError invalid_request(std::string message, std::optional<std::string> param = std::nullopt);
// 404 for a model this server does not serve.
ApiError model_not_found(std::string_view model);
// 404 for an unknown route, e.g. "Invalid URL (POST /v1/nope)".
ApiError route_not_found(std::string_view method, std::string_view path);
// 405 for a known route with the wrong method.
ApiError method_not_allowed(std::string_view method, std::string_view path);
// 413 for a body larger than limit_bytes.
ApiError payload_too_large(size_t limit_bytes);
// 429 (rate_limit_error) when the waiting queue is full; retry after `retry_after_seconds`.
ApiError too_many_requests(std::string message, int retry_after_seconds);
// 503 (server_error) when the server cannot take work now; retry after `retry_after_seconds`.
ApiError service_unavailable(std::string message, int retry_after_seconds);
// 401 (authentication_error) for an internal endpoint called without the cluster token.
ApiError unauthorized(std::string message);
// 401 as OpenAI answers a missing or wrong API key (invalid_request_error, invalid_api_key).
ApiError invalid_api_key(std::string message);
// 500 for a bug or an unexpected failure.
ApiError internal_server_error(std::string message);

// 502 (server_error) when an upstream node gave an answer the proxy cannot relay.
ApiError bad_gateway(std::string message);

// Default Retry-After for statuses that map to 429 / 503.
inline constexpr int kDefaultRetryAfterSeconds = 1;

// InvalidArgument, OutOfRange, FailedPrecondition, Unimplemented -> 400; NotFound -> 404;
// ResourceExhausted -> 429; Unavailable, DeadlineExceeded -> 503 (both with Retry-After);
// DataLoss, Internal (and kOk, which is a caller bug) -> 500. The message is the Status message.
ApiError api_error_from_status(const Status& status);

// "Bad Request", "Not Found", ... for the statuses above; "Error" otherwise.
std::string_view http_reason_phrase(int http_status);

// A value or the ApiError that explains why there is none (the protocol layer's Result).
template <typename T>
class [[nodiscard]] ApiResult {
 public:
  ApiResult(T value) : state_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  ApiResult(ApiError error) : state_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(state_); }
  const ApiError& error() const {
    PDS_CHECK(!ok(), "error() of a successful ApiResult");
    return std::get<ApiError>(state_);
  }
  T& value() & { return checked(); }
  const T& value() const& { return const_cast<ApiResult*>(this)->checked(); }
  T&& value() && { return std::move(checked()); }
  T* operator->() { return &checked(); }
  const T* operator->() const { return &const_cast<ApiResult*>(this)->checked(); }

 private:
  T& checked() {
    PDS_CHECK(ok(), "value() of a failed ApiResult: " + std::get<ApiError>(state_).message);
    return std::get<T>(state_);
  }
  std::variant<T, ApiError> state_;
};

}  // namespace pdserve
