// The shared cluster token that guards internal endpoints (node registration, prefill work,
// remote prefill requests): "Authorization: Bearer TOKEN". An empty configured token accepts
// everything (a single-machine development setup; the binaries warn about it).
#pragma once

#include <string>
#include <string_view>

#include "common/http/http_message.h"

namespace pdserve {

// Constant-time comparison, so the token cannot be guessed byte by byte from timings.
bool cluster_token_matches(const http::HttpRequest& request, std::string_view token);

inline std::string cluster_auth_header_value(std::string_view token) {
  return "Bearer " + std::string(token);
}

}  // namespace pdserve
