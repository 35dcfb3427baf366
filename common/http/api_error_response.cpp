#include "common/http/api_error_response.h"

#include <string>

namespace pdserve::http {

HttpResponse api_error_response(const ApiError& error) {
  HttpResponse response;
  response.status = error.http_status;
  response.body = error.body();
  if (error.retry_after_seconds) {
    response.headers.emplace_back("Retry-After", std::to_string(*error.retry_after_seconds));
  }
  return response;
}

}  // namespace pdserve::http
