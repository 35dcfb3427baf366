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
  // RFC 9110 section 11.6.1: a 401 names the scheme that would be accepted.
  if (error.http_status == 401) response.headers.emplace_back("WWW-Authenticate", "Bearer");
  return response;
}

}  // namespace pdserve::http
