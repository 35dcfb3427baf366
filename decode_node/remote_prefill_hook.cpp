#include "decode_node/remote_prefill_hook.h"

#include <utility>

#include "common/cluster/cluster_auth.h"
#include "common/http/http_client.h"

namespace pdserve {

OpenAiServer::RequestHook make_remote_prefill_hook(RemotePrefillPolicy policy) {
  return [policy = std::move(policy)](const http::HttpRequest& http_request,
                                      InferenceRequest& request) -> Status {
    const std::optional<std::string_view> header = http_request.header(kPrefillHeader);
    if (!header) return Status::ok_status();
    if (!cluster_token_matches(http_request, policy.cluster_token)) {
      return permission_denied(std::string(kPrefillHeader) + " needs the cluster token");
    }
    KvImportSource source;
    source.prefill_timeout = policy.prefill_timeout;
    std::string_view rest = *header;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      std::string_view url = rest.substr(0, comma);
      while (!url.empty() && url.front() == ' ') url.remove_prefix(1);
      while (!url.empty() && url.back() == ' ') url.remove_suffix(1);
      if (!url.empty()) {
        PDS_RETURN_IF_ERROR(http::parse_base_url(url).status().with_context(std::string(kPrefillHeader)));
        source.prefill_urls.emplace_back(url);
      }
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    if (source.prefill_urls.empty()) {
      return invalid_argument(std::string(kPrefillHeader) + " names no prefill node");
    }
    // A resumed stream prefills its delivered tokens with its prompt (all but the last).
    const size_t to_prefill = request.prompt_tokens.size() +
                              (request.resume ? request.resume->output_tokens.size() - 1 : 0);
    if (static_cast<int>(to_prefill) <= policy.local_prefill_max_tokens) {
      return Status::ok_status();  // short enough to prefill here
    }
    request.kv_import = std::move(source);
    return Status::ok_status();
  };
}

}  // namespace pdserve
