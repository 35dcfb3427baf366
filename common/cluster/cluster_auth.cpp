#include "common/cluster/cluster_auth.h"

#include <algorithm>
#include <cctype>
#include <utility>

#include "common/core/log.h"
#include "common/http/api_error_response.h"
#include "common/protocol/pdserve_headers.h"

namespace pdserve {

namespace {

// Whether `header` is `expected`; every byte of the header is read whatever the secret's length.
bool same_secret(std::optional<std::string_view> header, std::string_view expected) {
  if (!header) return false;
  unsigned char difference = header->size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < header->size(); ++i) {
    const char want = i < expected.size() ? expected[i] : '\0';
    difference |= static_cast<unsigned char>((*header)[i] ^ want);
  }
  return difference == 0;
}

// Anthropic's SDK sends its key as "x-api-key: KEY"; any client key may come that way.
bool api_key_header_matches(const http::HttpRequest& request, std::string_view key) {
  return !key.empty() && same_secret(request.header(kApiKeyHeader), key);
}

}  // namespace

bool bearer_matches(const http::HttpRequest& request, std::string_view secret) {
  if (secret.empty()) return false;
  return same_secret(request.header(kAuthorizationHeader), cluster_auth_header_value(secret));
}

bool cluster_token_matches(const http::HttpRequest& request, std::string_view token) {
  return token.empty() || bearer_matches(request, token);
}

Status check_cluster_token_format(std::string_view token) {
  constexpr std::string_view kFlag = "--cluster-token ($PDSERVE_CLUSTER_TOKEN)";
  const auto is_space = [](char c) { return c == ' ' || c == '\t'; };
  if (!token.empty() && std::ranges::all_of(token, is_space)) {
    return invalid_argument(std::string(kFlag) + " is only whitespace; give a secret");
  }
  if (std::ranges::any_of(token, [&](char c) {
        return !is_space(c) && std::iscntrl(static_cast<unsigned char>(c));
      })) {
    return invalid_argument(std::string(kFlag) +
                            " holds a control character, which no HTTP header can carry");
  }
  if (!token.empty() && (is_space(token.front()) || is_space(token.back()))) {
    return invalid_argument(std::string(kFlag) +
                            " starts or ends with whitespace, which HTTP drops from a header");
  }
  return Status::ok_status();
}

Status require_cluster_token(std::string_view token, bool insecure_no_cluster_token,
                             std::string_view who) {
  if (!token.empty()) return check_cluster_token_format(token);
  if (!insecure_no_cluster_token) {
    return invalid_argument(std::string(who) +
                            " needs a cluster token (--cluster-token or $PDSERVE_CLUSTER_TOKEN, "
                            "the same on the proxy and every node); --insecure-no-cluster-token "
                            "runs an open cluster that anyone who can reach it may join");
  }
  PDS_LOG_WARN(std::string(who) +
               " runs without a cluster token (--insecure-no-cluster-token): anyone who can reach "
               "it may join the cluster, read traces and receive prompts");
  return Status::ok_status();
}

std::optional<ApiError> check_access(const AccessPolicy& policy, RouteAccess access,
                                     const http::HttpRequest& request) {
  switch (access) {
    case RouteAccess::kOpen:
      return std::nullopt;
    case RouteAccess::kCluster:
      if (cluster_token_matches(request, policy.cluster_token)) return std::nullopt;
      return unauthorized("this endpoint needs the cluster token");
    case RouteAccess::kClient: {
      if (policy.api_keys.empty()) return std::nullopt;
      const bool key = std::ranges::any_of(policy.api_keys, [&](const std::string& k) {
        return bearer_matches(request, k) || api_key_header_matches(request, k);
      });
      if (key || bearer_matches(request, policy.cluster_token)) return std::nullopt;
      return invalid_api_key(request.header(kAuthorizationHeader) || request.header(kApiKeyHeader)
                                 ? "Incorrect API key provided."
                                 : "You didn't provide an API key. Send it as 'Authorization: "
                                   "Bearer YOUR_KEY' or 'x-api-key: YOUR_KEY'.");
    }
  }
  return unauthorized("unknown route access");
}

http::Handler guarded(const AccessPolicy& policy, RouteAccess access, http::Handler handler) {
  if (access == RouteAccess::kOpen) return handler;
  return [policy, access, handler = std::move(handler)](
             const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> channel) {
    if (std::optional<ApiError> refused = check_access(policy, access, request)) {
      channel->send(http::api_error_response(*refused));
      return;
    }
    handler(request, std::move(channel));
  };
}

}  // namespace pdserve
