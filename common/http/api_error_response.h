// An OpenAI-style error as an HTTP response: the error's status, its JSON body, Retry-After for
// 429 / 503 and "WWW-Authenticate: Bearer" for 401. Shared by the server's own errors and every
// front end's handlers.
#pragma once

#include "common/http/http_message.h"
#include "common/protocol/openai_error.h"

namespace pdserve::http {

HttpResponse api_error_response(const ApiError& error);

}  // namespace pdserve::http
