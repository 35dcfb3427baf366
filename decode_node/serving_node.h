// What the serving binaries share (pdserve-decode, pdserve-prefill): their model, engine and
// HTTP flags, the shutdown signals, building the engine (with the UCX KV connector of a
// disaggregated node), and joining a proxy's cluster.
#pragma once

#include <signal.h>

#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/cluster/node_agent.h"
#include "common/http/http_server.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/model/model_loader.h"
#include "kernels/model/model_runner.h"
#include "kv_transfer/ucx_kv_connector.h"

namespace pdserve {

struct ServingNodeOptions {
  std::string model;
  std::string device = "cpu";
  std::string dtype;
  int threads = 0;
  std::string host = "127.0.0.1";
  int port = 8000;
  int http_threads = 2;
  size_t max_body_bytes = size_t{16} << 20;
  int header_timeout_ms = 10'000;
  int idle_timeout_ms = 60'000;
  std::string kv_cache_dtype = "auto";
  EngineConfig engine;
  // Disaggregation.
  std::string proxy_url;       // register with this proxy (and send heartbeats)
  std::string cluster_token;
  std::string advertise_host;  // how other nodes reach this one (default: --host)
  std::string ucx_tls;         // UCX transports for KV ("tcp", "sm,self"; empty: UCX decides)
  int kv_transfer_timeout_ms = 30'000;
  int heartbeat_interval_ms = 1'000;
};

void add_serving_node_options(CLI::App& app, ServingNodeOptions& options);

// Blocks SIGINT and SIGTERM in this thread and the threads it starts later (call first).
sigset_t block_shutdown_signals();
int wait_for_shutdown_signal(const sigset_t& signals);

struct ServingNode {
  ServingNode(LoadedModel loaded, Tokenizer model_tokenizer)
      : model(std::move(loaded)), tokenizer(std::move(model_tokenizer)) {}

  LoadedModel model;
  Tokenizer tokenizer;
  std::unique_ptr<LlmEngine> engine;              // started
  kv_transfer::UcxKvConnector* connector = nullptr;  // owned by the engine; null when colocated
};

// Loads the model and starts its engine, with a KV connector when `with_kv_transfer`.
Result<std::unique_ptr<ServingNode>> start_serving_node(const ServingNodeOptions& options,
                                                        bool with_kv_transfer);

http::ServerOptions http_server_options(const ServingNodeOptions& options);

// The node's load, for heartbeats.
nlohmann::json node_load(const ServiceStats& stats);

// Registers the node with options.proxy_url (nothing when it is empty).
Result<std::unique_ptr<NodeAgent>> join_cluster(const ServingNodeOptions& options,
                                                const std::string& role, uint16_t port,
                                                const ServingNode& node);

}  // namespace pdserve
