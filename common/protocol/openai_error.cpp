#include "common/protocol/openai_error.h"

#include <nlohmann/json.hpp>

namespace pdserve {
namespace {

constexpr const char* kInvalidRequest = "invalid_request_error";
constexpr const char* kServerError = "server_error";

nlohmann::ordered_json null_or(const std::optional<std::string>& value) {
  return value ? nlohmann::ordered_json(*value) : nlohmann::ordered_json(nullptr);
}

}  // namespace

std::string ApiError::body() const {
  nlohmann::ordered_json error;
  error["message"] = message;
  error["type"] = type;
  error["param"] = null_or(param);
  error["code"] = null_or(code);
  nlohmann::ordered_json wrapper;
  wrapper["error"] = std::move(error);
  // Messages may quote client bytes that are not valid UTF-8: replace them, never throw.
  return wrapper.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

ApiError invalid_request(std::string message, std::optional<std::string> param) {
  return {400, std::move(message), kInvalidRequest, std::move(param), std::nullopt, std::nullopt};
}

ApiError model_not_found(std::string_view model) {
  return {404,
          "The model `" + std::string(model) + "` does not exist.",
          kInvalidRequest,
          "model",
          "model_not_found",
          std::nullopt};
}

ApiError route_not_found(std::string_view method, std::string_view path) {
  return {404,
          "Invalid URL (" + std::string(method) + " " + std::string(path) + ")",
          kInvalidRequest,
          std::nullopt,
          "not_found",
          std::nullopt};
}

ApiError method_not_allowed(std::string_view method, std::string_view path) {
  return {405,
          "Method " + std::string(method) + " is not allowed for " + std::string(path),
          kInvalidRequest,
          std::nullopt,
          "method_not_allowed",
          std::nullopt};
}

ApiError payload_too_large(size_t limit_bytes) {
  return {413,
          "The request body is larger than the limit of " + std::to_string(limit_bytes) + " bytes.",
          kInvalidRequest,
          std::nullopt,
          "request_too_large",
          std::nullopt};
}

ApiError too_many_requests(std::string message, int retry_after_seconds) {
  return {429,          std::move(message),    "rate_limit_error",
          std::nullopt, "rate_limit_exceeded", retry_after_seconds};
}

ApiError service_unavailable(std::string message, int retry_after_seconds) {
  return {503,          std::move(message),    kServerError,
          std::nullopt, "service_unavailable", retry_after_seconds};
}

ApiError unauthorized(std::string message) {
  ApiError error;
  error.http_status = 401;
  error.message = std::move(message);
  error.type = "authentication_error";
  error.code = "invalid_cluster_token";
  return error;
}

ApiError invalid_api_key(std::string message) {
  ApiError error;
  error.http_status = 401;
  error.message = std::move(message);
  error.type = "invalid_request_error";
  error.code = "invalid_api_key";
  return error;
}

ApiError internal_server_error(std::string message) {
  return {500, std::move(message), kServerError, std::nullopt, "internal_error", std::nullopt};
}

ApiError bad_gateway(std::string message) {
  return {502, std::move(message), kServerError, std::nullopt, "bad_gateway", std::nullopt};
}

ApiError api_error_from_status(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kUnimplemented:
    case StatusCode::kCancelled:
      return invalid_request(status.message());
    case StatusCode::kNotFound:
      return {404, status.message(), kInvalidRequest, std::nullopt, "not_found", std::nullopt};
    case StatusCode::kResourceExhausted:
      return too_many_requests(status.message(), kDefaultRetryAfterSeconds);
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
      return service_unavailable(status.message(), kDefaultRetryAfterSeconds);
    case StatusCode::kPermissionDenied:
      return unauthorized(status.message());
    case StatusCode::kOk:
      return internal_server_error("an error was reported with an OK status");
    case StatusCode::kDataLoss:
    case StatusCode::kInternal:
      break;
  }
  return internal_server_error(status.message());
}

std::string_view http_reason_phrase(int http_status) {
  switch (http_status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 500:
      return "Internal Server Error";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

}  // namespace pdserve
