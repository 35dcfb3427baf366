#include "common/cluster/cluster_auth.h"

namespace pdserve {

bool cluster_token_matches(const http::HttpRequest& request, std::string_view token) {
  if (token.empty()) return true;
  const std::optional<std::string_view> header = request.header("Authorization");
  if (!header) return false;
  const std::string expected = cluster_auth_header_value(token);
  if (header->size() != expected.size()) return false;
  unsigned char difference = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    difference |= static_cast<unsigned char>((*header)[i] ^ expected[i]);
  }
  return difference == 0;
}

}  // namespace pdserve
