// pdserve-decode: a serving node with the OpenAI HTTP API. Alone it serves both phases (the
// colocated baseline). In a disaggregated cluster (--proxy, or --kv-transfer behind a proxy
// with a static node list) it takes requests whose prompt the proxy sent to a prefill node
// (header X-Pdserve-Prefill, with the cluster token): it reserves the prompt's blocks, asks
// the prefill node to compute them, receives the KV over UCX straight into those blocks and
// generates the rest; prompts of at most --local-prefill-max-tokens it prefills itself.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/chat/chat_template.h"
#include "common/core/cli.h"
#include "common/engine/spec_decode/speculative_config.h"
#include "common/http/http_client.h"
#include "decode_node/remote_prefill_hook.h"
#include "serving/openai/openai_server.h"
#include "serving/serving_node.h"

namespace pdserve {
namespace {

struct Options {
  ServingNodeOptions node;
  bool kv_transfer = false;
  int local_prefill_max_tokens = 0;
  int prefill_timeout_ms = 120'000;
  std::string kv_checksum = "on";
  std::string speculative_config;  // JSON; parsed into node.engine.speculative
  OpenAiOptions api;
};

// PDSERVE_TEST_SCRIPTED_OUTPUT=1 (tests only, decode_node/README.md): requests may script
// their output (OpenAiOptions::test_scripted_output).
bool test_scripted_output_enabled() {
  const char* value = std::getenv("PDSERVE_TEST_SCRIPTED_OUTPUT");
  return value != nullptr && std::string_view(value) == "1";
}

Status run(const Options& options) {
  const sigset_t signals = block_shutdown_signals();
  const bool disaggregated = options.kv_transfer || !options.node.proxy_urls.empty();
  PDS_ASSIGN_OR_RETURN(
      std::unique_ptr<ServingNode> node,
      start_serving_node(options.node,
                         disaggregated ? std::optional(NodeRole::kDecode) : std::nullopt));
  if (node->connector != nullptr) node->connector->set_kv_checksum(options.kv_checksum == "on");
  PDS_ASSIGN_OR_RETURN(
      ChatTemplate chat_template,
      ChatTemplate::from_tokenizer_config(node->model.model_dir / "tokenizer_config.json"));
  OpenAiOptions api_options = options.api;
  api_options.access.cluster_token = options.node.cluster_token;
  api_options.test_scripted_output = test_scripted_output_enabled();
  api_options.draining = [&membership = node->membership] { return membership.draining(); };
  OpenAiServer api(*node->engine, node->tokenizer, chat_template, api_options);
  if (disaggregated) {
    RemotePrefillPolicy policy;
    policy.cluster_token = options.node.cluster_token;
    policy.local_prefill_max_tokens = options.local_prefill_max_tokens;
    policy.prefill_timeout = std::chrono::milliseconds(options.prefill_timeout_ms);
    api.set_request_hook(make_remote_prefill_hook(std::move(policy)));
  }
  http::RouteTable router;
  api.register_routes(router);
  return serve_until_shutdown(
      options.node, signals, NodeRole::kDecode, *node, std::move(router), [&](uint16_t port) {
        std::printf("pdserve-decode: serving %s on %s (device %s%s)\n",
                    node->engine->model_info().name.c_str(),
                    http::join_base_url(options.node.host, std::to_string(port)).c_str(),
                    options.node.device.c_str(), disaggregated ? ", KV transfer on" : "");
        std::fflush(stdout);
      });
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  pdserve::Options options;
  CLI::App app{
      "pdserve-decode: a serving node with the OpenAI HTTP API (colocated, or the decode side of a "
      "disaggregated cluster)"};
  pdserve::add_serving_node_options(app, options.node);
  app.add_flag("--kv-transfer", options.kv_transfer,
               "Accept remotely prefilled requests (implied by --proxy)");
  app.add_option("--local-prefill-max-tokens", options.local_prefill_max_tokens,
                 "Prefill prompts of at most this many tokens here instead of on a prefill node")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--prefill-timeout-ms", options.prefill_timeout_ms,
                 "Deadline for a prefill node's first token")
      ->capture_default_str()
      ->check(CLI::Range(1, 3'600'000));
  app.add_option("--kv-checksum", options.kv_checksum,
                 "Verify an XXH3 checksum of every imported KV block before its sequence decodes "
                 "(a mismatch prefills the request here); not on a GPU pool on the direct "
                 "(zero-copy) KV path")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--speculative-config", options.speculative_config,
                 "Speculative decoding, as vLLM's JSON: {\"method\": \"ngram\", "
                 "\"num_speculative_tokens\": K, \"prompt_lookup_min\": N, "
                 "\"prompt_lookup_max\": M} or {\"method\": \"draft_model\", \"model\": "
                 "PATH, \"num_speculative_tokens\": K}. On a disaggregated node only the "
                 "decode side speculates (docs/SPECULATIVE.md)");
  app.add_option("--api-key", options.api.access.api_keys,
                 "Client API key(s) for the OpenAI API (Authorization: Bearer KEY or x-api-key: "
                 "KEY; repeat for several); also read from $PDSERVE_API_KEY. Default: the API "
                 "is open")
      ->envname("PDSERVE_API_KEY");
  app.add_flag("--strict-request-fields", options.api.strict_request_fields,
               "Refuse requests with unknown fields (400) instead of ignoring them with a log line");
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  if (!options.speculative_config.empty()) {
    pdserve::Result<pdserve::SpeculativeConfig> speculative =
        pdserve::parse_speculative_config(options.speculative_config);
    if (!speculative.ok()) return pdserve::report_cli_error(speculative.status());
    options.node.engine.speculative = *speculative;
  }
  pdserve::Status status = pdserve::capture_status([&] { return pdserve::run(options); });
  return status.ok() ? 0 : pdserve::report_cli_error(status);
}
