// pdserve-prefill: the prefill side of a disaggregated cluster. Decode nodes send it prompts
// (POST /internal/v1/prefill); it batches and chunks them with the engine's scheduler, keeps a
// prefix cache, answers each with its first token at once and writes the prompt's KV over UCX
// straight into the decode node's blocks.
#include <cstdio>
#include <string>

#include "common/core/cli.h"
#include "common/http/http_client.h"
#include "prefill_node/prefill_server.h"
#include "serving/serving_node.h"

namespace pdserve {
namespace {

Status run(const ServingNodeOptions& options, bool kv_layerwise) {
  const sigset_t signals = block_shutdown_signals();
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<ServingNode> node,
                       start_serving_node(options, NodeRole::kPrefill));
  node->connector->set_layerwise(kv_layerwise);
  PrefillServer prefill(*node->engine, kv_block_layout(node->connector->layout()),
                        options.cluster_token,
                        [&membership = node->membership] { return membership.draining(); });
  http::RouteTable router;
  prefill.register_routes(router);
  return serve_until_shutdown(
      options, signals, NodeRole::kPrefill, *node, std::move(router), [&](uint16_t port) {
        std::printf("pdserve-prefill: prefilling %s on %s (device %s, KV blocks %s)\n",
                    node->engine->model_info().name.c_str(),
                    http::join_base_url(options.host, std::to_string(port)).c_str(),
                    options.device.c_str(),
                    kv_block_layout(node->connector->layout()).to_string().c_str());
        std::fflush(stdout);
      });
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  pdserve::ServingNodeOptions options;
  options.port = 8100;
  options.engine.max_num_seqs = 64;
  CLI::App app{"pdserve-prefill: the prefill node of a disaggregated cluster"};
  pdserve::add_serving_node_options(app, options);
  std::string kv_layerwise = "on";
  app.add_option("--kv-layerwise", kv_layerwise,
                 "send each layer's KV while the next layers compute (on) or all of it after "
                 "the forward (off)")
      ->check(CLI::IsMember({"on", "off"}));
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  pdserve::Status status =
      pdserve::capture_status([&] { return pdserve::run(options, kv_layerwise == "on"); });
  return status.ok() ? 0 : pdserve::report_cli_error(status);
}
