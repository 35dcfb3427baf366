// Which requests a disaggregated decode node prefills remotely: those the proxy routed with
// the header `X-Pdserve-Prefill: URL[,URL...]` (prefill nodes, tried in order) and the
// cluster token, whose prompt is longer than local_prefill_max_tokens. A prefill header
// without the right token is refused (403), so no stranger can make the node call arbitrary
// addresses or accept KV from them.
#pragma once

#include <chrono>
#include <string>

#include "common/protocol/pdserve_headers.h"
#include "serving/openai/openai_server.h"

namespace pdserve {

struct RemotePrefillPolicy {
  std::string cluster_token;
  int local_prefill_max_tokens = 0;
  std::chrono::milliseconds prefill_timeout{120'000};
};

OpenAiServer::RequestHook make_remote_prefill_hook(RemotePrefillPolicy policy);

}  // namespace pdserve
