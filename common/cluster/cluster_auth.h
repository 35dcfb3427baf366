// Who may call what. Two credentials, both sent as "Authorization: Bearer SECRET":
//  * the cluster token, shared by the proxy and its nodes: internal and admin endpoints
//    (registration, heartbeats, /cluster*, /trace, /internal/*, remote prefill headers);
//  * client API keys (--api-key): the OpenAI API, as the bearer or as "x-api-key: KEY"
//    (Anthropic's SDK). A cluster token holder may call it too (the
//    proxy forwards requests to decode nodes with the token).
// An empty cluster token is an open cluster: only with --insecure-no-cluster-token, for a
// single-machine development setup (the binaries refuse to start without one otherwise).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/status.h"
#include "common/http/http_message.h"
#include "common/http/route_table.h"
#include "common/protocol/openai_error.h"

namespace pdserve {

// Whether the request's Authorization header is "Bearer " + `secret`; constant time in the
// header, so a secret cannot be guessed byte by byte from timings. False for an empty secret.
bool bearer_matches(const http::HttpRequest& request, std::string_view secret);

// True for an empty (open) token, else bearer_matches.
bool cluster_token_matches(const http::HttpRequest& request, std::string_view token);

inline std::string cluster_auth_header_value(std::string_view token) {
  return "Bearer " + std::string(token);
}

// InvalidArgument (a usage error, exit 2) for a cluster token no request could present: only
// whitespace, whitespace at either end (HTTP trims it from a header value) or a control
// character (no header value may hold one). An empty token (an open cluster) passes.
Status check_cluster_token_format(std::string_view token);

// Closed by default: InvalidArgument (a usage error, exit 2) when a process that is part of a
// cluster has no cluster token and was not started with --insecure-no-cluster-token, or one
// check_cluster_token_format refuses; a warning when it runs open on purpose.
Status require_cluster_token(std::string_view token, bool insecure_no_cluster_token,
                             std::string_view who);

// The credential a route asks for.
enum class RouteAccess {
  kOpen,     // /health, /metrics, /openapi.json
  kClient,   // the OpenAI API: an API key when any is configured, or the cluster token
  kCluster,  // internal and admin endpoints: the cluster token
};

struct AccessPolicy {
  std::string cluster_token;          // empty: an open cluster
  std::vector<std::string> api_keys;  // empty: the OpenAI API needs no key
};

// nullopt when `request` may call a route of `access`, else the 401 to answer.
std::optional<ApiError> check_access(const AccessPolicy& policy, RouteAccess access,
                                     const http::HttpRequest& request);

// `handler` behind check_access; the 401 carries "WWW-Authenticate: Bearer" (as every 401 of
// api_error_response does).
http::Handler guarded(const AccessPolicy& policy, RouteAccess access, http::Handler handler);

}  // namespace pdserve
