// pdserve-prefill: the prefill side of a disaggregated cluster. Decode nodes send it prompts
// (POST /internal/v1/prefill); it batches and chunks them with the engine's scheduler, keeps a
// prefix cache, answers each with its first token at once and writes the prompt's KV over UCX
// straight into the decode node's blocks.
#include <cstdio>
#include <string>

#include "common/cluster/cluster_auth.h"
#include "common/core/cli.h"
#include "common/core/log.h"
#include "common/http/http_client.h"
#include "prefill_node/prefill_server.h"
#include "serving/serving_node.h"

namespace pdserve {
namespace {

// Where the node learns the UCX workers it may send KV to: its proxies, unless told to send KV
// anywhere. Checked before the (slow) model load, after the cluster token's own errors (those
// of start_serving_node, which come first when there is no token at all).
Status check_kv_peer_source(const ServingNodeOptions& options, bool unregistered_kv_peers) {
  PDS_RETURN_IF_ERROR(check_cluster_token_format(options.cluster_token));
  const bool token_given = !options.cluster_token.empty() || options.insecure_no_cluster_token;
  if (!token_given || unregistered_kv_peers || !options.proxy_urls.empty()) {
    return Status::ok_status();
  }
  return invalid_argument(
      "a prefill node learns the decode nodes it may send KV to from its proxies: give --proxy, "
      "or --insecure-unregistered-kv-peers to send KV to any UCX worker a work request names");
}

// The decode nodes registered at the node's proxies (null: any worker, on purpose).
Result<std::unique_ptr<kv_transfer::KvPeerAllowlist>> kv_peers(const ServingNodeOptions& options,
                                                               bool unregistered_kv_peers) {
  if (!unregistered_kv_peers) {
    return kv_transfer::KvPeerAllowlist::create({options.proxy_urls, options.cluster_token});
  }
  PDS_LOG_WARN(
      "--insecure-unregistered-kv-peers: KV goes to any UCX worker a work request "
      "names; a malformed address can stop this node inside UCX");
  return std::unique_ptr<kv_transfer::KvPeerAllowlist>();
}

Status run(const ServingNodeOptions& options, bool kv_layerwise, bool unregistered_kv_peers) {
  PDS_RETURN_IF_ERROR(check_kv_peer_source(options, unregistered_kv_peers));
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<kv_transfer::KvPeerAllowlist> peers,
                       kv_peers(options, unregistered_kv_peers));
  const sigset_t signals = block_shutdown_signals();
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<ServingNode> node,
                       start_serving_node(options, NodeRole::kPrefill));
  node->connector->set_layerwise(kv_layerwise);
  PrefillServer prefill(
      *node->engine, node->connector->block_layout(), options.cluster_token,
      [&membership = node->membership] { return membership.draining(); }, std::move(peers));
  http::RouteTable router;
  prefill.register_routes(router);
  return serve_until_shutdown(
      options, signals, NodeRole::kPrefill, *node, std::move(router), [&](uint16_t port) {
        std::printf("pdserve-prefill: prefilling %s on %s (device %s, KV blocks %s)\n",
                    node->engine->model_info().name.c_str(),
                    http::join_base_url(options.host, std::to_string(port)).c_str(),
                    options.device.c_str(), node->connector->block_layout().to_string().c_str());
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
  bool unregistered_kv_peers = false;
  app.add_flag("--insecure-unregistered-kv-peers", unregistered_kv_peers,
               "Send KV to any UCX worker a work request names, not only to the decode nodes "
               "registered at this node's --proxy (needed without --proxy). A malformed worker "
               "address can then stop this node inside UCX. Development only");
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  pdserve::Status status = pdserve::capture_status(
      [&] { return pdserve::run(options, kv_layerwise == "on", unregistered_kv_peers); });
  return status.ok() ? 0 : pdserve::report_cli_error(status);
}
