// What the serving binaries share (pdserve-decode, pdserve-prefill): their model, engine and
// HTTP flags, the shutdown signals, building the engine (with the UCX KV connector of a
// disaggregated node), and joining a proxy's cluster.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/cluster/cluster_membership.h"
#include "common/core/shutdown_signals.h"
#include "common/engine/tiered_key_source.h"
#include "common/http/http_server.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/tokenizer_files.h"
#include "kernels/model/model_loader.h"
#include "kv_transfer/ucx_kv_connector.h"
#include "serving/engine_assembly.h"

namespace pdserve {

struct ServingNodeOptions {
  std::string model;
  std::string device = "cpu";
  std::string dtype;
  bool weights_mmap = false;  // ModelLoadOptions::weights_mmap
  int threads = 0;
  std::string host = "127.0.0.1";
  int port = 8000;
  int http_threads = 2;
  size_t max_body_bytes = size_t{16} << 20;
  int header_timeout_ms = 10'000;
  int idle_timeout_ms = 60'000;
  int warm_up_timeout_ms = 600'000;  // a big model's first steps on a cold page cache
  std::string kv_cache_dtype = "auto";
  EngineConfig engine;
  // Disaggregation.
  // Register with each of these proxies (pdserve-proxy replicas) and send them heartbeats.
  std::vector<std::string> proxy_urls;
  std::string cluster_token;
  bool insecure_no_cluster_token = false;  // join a cluster without a token (development)
  std::string advertise_host;  // how other nodes reach this one (default: --host)
  std::string ucx_tls;         // UCX transports for KV ("tcp", "sm,self"; empty: UCX decides)
  int kv_transfer_timeout_ms = 30'000;
  // How KV leaves and enters the pool (kv_transfer/kv_transfer_service.h): auto, direct or
  // staged, and the staging memory (a prefill node's send ring, a decode node's landing area).
  std::string kv_transfer_path = "auto";
  int kv_staging_mib = 1024;
  int heartbeat_interval_ms = 1'000;
  bool exit_when_drained = false;
  int log_stats_interval_s = 10;  // the periodic stats line; 0: none  // exit 0 once the proxy drained this node and it is idle
};

void add_serving_node_options(CLI::App& app, ServingNodeOptions& options);

// What /metrics says of the node's cluster membership (pdserve:node_state): whether a proxy
// drained it. Thread-safe: scrapes read it while serve_until_shutdown attaches and detaches the
// node's agents.
class NodeMembership {
 public:
  void attach(const ClusterMembership* membership);  // null: not (or no longer) in a cluster
  bool draining() const;

 private:
  mutable std::mutex mutex_;
  const ClusterMembership* membership_ = nullptr;
};

struct ServingNode {
  ServingNode(LoadedModel loaded, Tokenizer model_tokenizer)
      : model(std::move(loaded)), tokenizer(std::move(model_tokenizer)) {}

  LoadedModel model;
  Tokenizer tokenizer;
  // The model's tokenizer files, served to proxies (GET /cluster/tokenizer), and their
  // identity, advertised when registering.
  std::shared_ptr<const TokenizerFiles> tokenizer_files;
  std::string tokenizer_sha256;
  std::unique_ptr<LlmEngine> engine;                 // started
  kv_transfer::UcxKvConnector* connector = nullptr;  // owned by the engine; null when colocated
  // The keys in the node's lower KV tiers (host memory, disk), reported to its proxies beside the
  // pool's (Heartbeat::tiered_cache); null: the node has no tiers and reports none. Must outlive
  // serve_until_shutdown.
  TieredKeySource* tiered_keys = nullptr;
  NodeMembership membership;
};

// Loads the model, starts its engine, with a KV connector when `kv_role` is set (its role in
// the cluster: a prefill node exports KV, a decode node imports it; needs a cluster token or
// --insecure-no-cluster-token: InvalidArgument otherwise), and warms it up
// (common/engine/warm_up.h): the node serves, and joins a cluster, only after that.
Result<std::unique_ptr<ServingNode>> start_serving_node(const ServingNodeOptions& options,
                                                        std::optional<NodeRole> kv_role);

// Serves `router` over HTTP, registered with every proxy of options.proxy_urls as `role`,
// until SIGINT/SIGTERM (blocked by the caller in `signals`), or with exit_when_drained until the
// proxy drained the node and its last request finished; then leaves the cluster, closes the
// connections and stops the engine, in that order. `announce` runs once the port is bound.
Status serve_until_shutdown(const ServingNodeOptions& options, const sigset_t& signals,
                            NodeRole role, ServingNode& node, http::RouteTable router,
                            const std::function<void(uint16_t port)>& announce);

}  // namespace pdserve
