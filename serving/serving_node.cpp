#include "serving/serving_node.h"

#include <signal.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>
#include <utility>

#include "common/cluster/cluster_auth.h"
#include "common/core/cli.h"
#include "common/core/log.h"
#include "common/engine/warm_up.h"
#include "common/http/http_client.h"
#include "common/http/openapi_route.h"
#include "kv_transfer/pool_connector.h"
#include "serving/prefix_cache_fanout.h"
#include "serving/prefix_cache_feeds.h"
#include "serving/stats_log.h"

namespace pdserve {

void add_serving_node_options(CLI::App& app, ServingNodeOptions& options) {
  app.add_option("--model", options.model, "Model folder, or a hub id in the local HF cache")
      ->required();
  app.add_option("--device", options.device, "cpu, cuda (device 0) or cuda:N")
      ->capture_default_str();
  app.add_option("--dtype", options.dtype,
                 "cpu: the weights' dtype, bfloat16, float16 or float32 (default: the "
                 "checkpoint's). cuda: the compute dtype, bfloat16 (default) or float32 (strict)");
  app.add_flag("--weights-mmap", options.weights_mmap,
               "cpu: compute on the checkpoint's mmap, whose page cache the processes of this "
               "machine loading the same files share, instead of a private copy of the weights "
               "on huge pages (faster decode)");
  app.add_option("--threads", options.threads, "CPU compute threads (0: all cores)")
      ->capture_default_str();
  app.add_option("--host", options.host, "Address to listen on")->capture_default_str();
  app.add_option("--port", options.port, "Port to listen on (0: any free port, printed at start)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--http-threads", options.http_threads, "HTTP I/O threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--max-body-bytes", options.max_body_bytes,
                 "Largest request body; larger gets 413")
      ->capture_default_str();
  app.add_option("--header-timeout-ms", options.header_timeout_ms,
                 "Deadline for a request's headers (drops slowloris clients)")
      ->capture_default_str()
      ->check(CLI::Range(1, 3'600'000));
  app.add_option("--idle-timeout-ms", options.idle_timeout_ms, "Keep-alive idle deadline")
      ->capture_default_str()
      ->check(CLI::Range(1, 3'600'000));
  app.add_option(
      "--served-model-name", options.engine.served_model_name,
      "Model name in the API (default: the hub id given to --model, else the model folder's name)");
  app.add_option("--kv-cache-memory-gib", options.engine.kv_cache_memory_gib,
                 "Memory for the paged KV cache (default: 4 on cpu; on cuda the cache takes "
                 "what --gpu-memory-utilization leaves unless this is given)");
  app.add_option("--gpu-memory-utilization", options.engine.gpu_memory_utilization,
                 "cuda: fraction of the device's total memory this node may use (weights, "
                 "activations, CUDA graphs and the KV cache; memory other processes hold "
                 "counts against it), in (0, 1]")
      ->capture_default_str();
  app.add_option("--kv-cache-dtype", options.kv_cache_dtype,
                 "KV cache element type: auto (the backend's default: bfloat16 on the CPU at the "
                 "avx512_bf16 level and on CUDA, else float32), bfloat16, float32, or fp8 / "
                 "fp8_e4m3 (FP8 E4M3 with per-layer scales: half the bytes of bfloat16)")
      ->capture_default_str();
  app.add_option("--kv-offload-host-gib", options.engine.kv_offload_host_gib,
                 "Host memory (page-locked on cuda) for prefix-cache KV blocks evicted from the "
                 "pool, reloaded when a later prompt shares the prefix (0: no KV tiers)")
      ->capture_default_str();
  app.add_option("--kv-offload-disk-dir", options.engine.kv_offload_disk_dir,
                 "An existing, writable folder for a disk tier below the host tier: blocks "
                 "evicted from host memory go there and survive a restart with the same model "
                 "and KV layout (needs --kv-offload-host-gib and --kv-offload-disk-gib)");
  app.add_option("--kv-offload-disk-gib", options.engine.kv_offload_disk_gib,
                 "Disk space of the disk tier")
      ->capture_default_str();
  app.add_option("--block-size", options.engine.block_size, "Tokens per KV block")
      ->capture_default_str();
  app.add_option("--max-num-batched-tokens", options.engine.max_num_batched_tokens,
                 "Token budget of one engine step")
      ->capture_default_str();
  app.add_option("--max-num-seqs", options.engine.max_num_seqs, "Most sequences running at once")
      ->capture_default_str();
  app.add_option("--max-waiting", options.engine.max_num_waiting,
                 "Most queued requests; more get 429 with Retry-After")
      ->capture_default_str();
  app.add_option("--max-model-len", options.engine.max_model_len,
                 "Context length (0: the model's max_position_embeddings)")
      ->capture_default_str();
  app.add_option("--warm-up-timeout-ms", options.warm_up_timeout_ms,
                 "Deadline of the warm-up request the node runs before it serves (its first "
                 "steps load the weights' pages and plans; a failure stops the node)")
      ->capture_default_str()
      ->check(CLI::Range(1, 3'600'000));
  app.add_option("--proxy", options.proxy_urls,
                 "Register with this pdserve-proxy (http://HOST:PORT) and send it heartbeats; "
                 "repeat it (or give a comma-separated list) for a cluster served by several "
                 "proxy replicas: the node registers with each, and a drain at one drains it at "
                 "all")
      ->delimiter(',');
  app.add_option("--cluster-token", options.cluster_token,
                 "Shared secret for internal endpoints (registration, KV); also read from "
                 "$PDSERVE_CLUSTER_TOKEN. No whitespace at either end, no control character")
      ->envname("PDSERVE_CLUSTER_TOKEN");
  app.add_flag("--insecure-no-cluster-token", options.insecure_no_cluster_token,
               "Join a cluster without a cluster token: anyone who can reach the node may send it "
               "work or make it fetch KV from any address. Development only");
  app.add_option("--advertise-host", options.advertise_host,
                 "Address other nodes use to reach this one (default: --host)");
  app.add_option("--ucx-tls", options.ucx_tls,
                 "UCX transports for KV blocks, e.g. tcp or sm,self (default: UCX's choice)");
  app.add_option("--kv-transfer-timeout-ms", options.kv_transfer_timeout_ms,
                 "Deadline of one KV transfer")
      ->capture_default_str()
      ->check(CLI::Range(1, 3'600'000));
  app.add_option("--kv-transfer-path", options.kv_transfer_path,
                 "How KV blocks leave and enter the pool: direct (UCX reads and writes the pool), "
                 "staged (through pinned host buffers, for a GPU pool on a UCX without CUDA "
                 "memory support), or auto (staged exactly then)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "direct", "staged"}));
  app.add_option("--kv-staging-mib", options.kv_staging_mib,
                 "Pinned host memory of the staged KV path: a prefill node's send buffers, a "
                 "decode node's landing area (a request whose prompt needs more waits or is "
                 "prefilled locally)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--heartbeat-interval-ms", options.heartbeat_interval_ms,
                 "Heartbeats to the proxy")
      ->capture_default_str()
      ->check(CLI::Range(10, 60'000));
  app.add_option("--log-stats-interval-s", options.log_stats_interval_s,
                 "Seconds between the stats lines logged while there is work (0: none)")
      ->capture_default_str()
      ->check(CLI::Range(0, 86'400));
  add_log_options(app);
  app.add_flag("--exit-when-drained", options.exit_when_drained,
               "Exit 0 once the proxy has drained this node (POST /cluster/nodes/ID/drain) and its "
               "last request has finished");
}

namespace {

// A missing or read-only disk tier folder is a bad flag (exit 2), told before the model load.
Status check_kv_offload_disk_dir(const std::string& dir) {
  if (dir.empty()) return Status::ok_status();
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error)) {
    return invalid_argument("--kv-offload-disk-dir " + dir + " is not an existing folder");
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return invalid_argument("--kv-offload-disk-dir " + dir +
                            " is not writable: " + std::strerror(errno));
  }
  return Status::ok_status();
}

// The address a node registers must reach it from other machines: a wildcard listen address
// (every interface) names none, so it needs --advertise-host.
Status check_advertised_host(const ServingNodeOptions& options) {
  if (!options.advertise_host.empty()) return Status::ok_status();
  for (const char* wildcard : {"0.0.0.0", "::", "[::]", ""}) {
    if (options.host == wildcard) {
      return invalid_argument("--host '" + options.host +
                              "' listens on every interface, which is no address to register "
                              "with the proxy: give --advertise-host, the address other nodes "
                              "reach this one at");
    }
  }
  return Status::ok_status();
}

// PDSERVE_TEST_KV_CORRUPT_EVERY=N (tests only, docs/RELIABILITY.md): the connector flips a
// byte of every Nth imported block before verifying its checksum.
Result<int> test_corrupt_every() {
  const char* value = std::getenv("PDSERVE_TEST_KV_CORRUPT_EVERY");
  if (value == nullptr) return 0;
  int every = 0;
  const char* end = value + std::strlen(value);
  const auto [stop, error] = std::from_chars(value, end, every);
  if (error != std::errc() || stop != end || every < 0) {
    return invalid_argument(
        std::string("PDSERVE_TEST_KV_CORRUPT_EVERY must be an integer >= 0, got '") + value + "'");
  }
  return every;
}

}  // namespace

Result<std::unique_ptr<ServingNode>> start_serving_node(const ServingNodeOptions& options,
                                                        std::optional<NodeRole> kv_role) {
  const bool with_kv_transfer = kv_role.has_value();
  if (with_kv_transfer) {
    PDS_RETURN_IF_ERROR(require_cluster_token(options.cluster_token,
                                              options.insecure_no_cluster_token,
                                              "a node that joins a cluster (pdserve-prefill, "
                                              "pdserve-decode with --proxy or --kv-transfer)"));
  } else {
    PDS_RETURN_IF_ERROR(check_cluster_token_format(options.cluster_token));
  }
  if (!options.proxy_urls.empty()) PDS_RETURN_IF_ERROR(check_advertised_host(options));
  // Checked before the (slow) model load.
  PDS_RETURN_IF_ERROR(check_gpu_memory_utilization(options.engine.gpu_memory_utilization));
  PDS_RETURN_IF_ERROR(check_kv_offload_disk_dir(options.engine.kv_offload_disk_dir));
  PDS_ASSIGN_OR_RETURN(ModelLoadOptions load_options,
                       model_load_options(options.device, options.threads, options.dtype));
  load_options.weights_mmap = options.weights_mmap;
  EngineConfig engine_config = options.engine;
  PDS_ASSIGN_OR_RETURN(engine_config.kv_cache_dtype, parse_kv_cache_dtype(options.kv_cache_dtype));
  PDS_ASSIGN_OR_RETURN(LoadedModel loaded, load_model(options.model, load_options));
  PDS_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::from_model_dir(loaded.model_dir));
  PDS_ASSIGN_OR_RETURN(TokenizerFiles tokenizer_files, TokenizerFiles::read(loaded.model_dir));
  auto node = std::make_unique<ServingNode>(std::move(loaded), std::move(tokenizer));
  node->tokenizer_sha256 = tokenizer_files.sha256();
  node->tokenizer_files = std::make_shared<const TokenizerFiles>(std::move(tokenizer_files));
  KvConnectorFactory factory;
  if (with_kv_transfer) {
    kv_transfer::UcxKvConnectorOptions connector_options;
    connector_options.transports = options.ucx_tls;
    connector_options.cluster_token = options.cluster_token;
    connector_options.transfer_timeout = std::chrono::milliseconds(options.kv_transfer_timeout_ms);
    PDS_ASSIGN_OR_RETURN(connector_options.path,
                         kv_transfer::parse_transfer_path(options.kv_transfer_path));
    // A prefill node only sends, a decode node only receives: each stages one direction.
    const std::uint64_t staging_bytes = std::uint64_t(options.kv_staging_mib) << 20;
    (*kv_role == NodeRole::kPrefill ? connector_options.staging_send_bytes
                                    : connector_options.staging_receive_bytes) = staging_bytes;
    PDS_ASSIGN_OR_RETURN(connector_options.test_corrupt_every, test_corrupt_every());
    factory = [&node,
               connector_options](const KvCache& pool) -> Result<std::unique_ptr<KvConnector>> {
      PDS_ASSIGN_OR_RETURN(std::unique_ptr<kv_transfer::UcxKvConnector> connector,
                           kv_transfer::make_pool_connector(pool, connector_options));
      node->connector = connector.get();
      return std::unique_ptr<KvConnector>(std::move(connector));
    };
  }
  PDS_ASSIGN_OR_RETURN(node->engine,
                       make_llm_engine(node->model, node->tokenizer, engine_config, factory));
  PDS_RETURN_IF_ERROR(node->engine->start());
  // The engine owns the node's KV tier store (null without tiers: the heartbeats then carry no
  // tiered report), so it outlives serve_until_shutdown.
  node->tiered_keys = node->engine->tiered_key_source();
  PDS_ASSIGN_OR_RETURN(const WarmUpReport warmed,
                       warm_up(*node->engine, std::chrono::milliseconds(options.warm_up_timeout_ms)));
  PDS_LOG_INFO("warm-up: " + std::to_string(warmed.generated_tokens) + " tokens in " +
               std::to_string(warmed.elapsed.count()) + " ms; ready");
  PDS_LOG_INFO(capacity_log_line(node->engine->stats(), engine_config.block_size,
                                 node->engine->model_info().max_model_len));
  return node;
}

namespace {

constexpr auto kDrainPollInterval = std::chrono::milliseconds(20);

http::ServerOptions http_server_options(const ServingNodeOptions& options) {
  http::ServerOptions server;
  server.host = options.host;
  server.port = static_cast<uint16_t>(options.port);
  server.threads = options.http_threads;
  server.max_body_bytes = options.max_body_bytes;
  server.header_timeout = std::chrono::milliseconds(options.header_timeout_ms);
  server.idle_timeout = std::chrono::milliseconds(options.idle_timeout_ms);
  return server;
}

// The node's load, for heartbeats.
NodeLoad node_load(const ServiceStats& stats) {
  NodeLoad load;
  load.num_running = stats.num_running;
  load.num_waiting = stats.num_waiting;
  load.kv_blocks_total = stats.kv_blocks_total;
  load.kv_blocks_used = stats.kv_blocks_used;
  load.prompt_tokens_total = stats.prompt_tokens_total;
  load.generation_tokens_total = stats.generation_tokens_total;
  return load;
}

// The node's registrations with its proxies; the fan-outs outlive the agents reading them.
struct ClusterJoin {
  std::unique_ptr<PrefixCacheFanout> prefix_cache;
  std::unique_ptr<PrefixCacheFanout> tiered_cache;
  std::unique_ptr<ClusterMembership> membership;  // null: not in a cluster
};

// Registers the node with every proxy of options.proxy_urls (nothing when there is none).
Result<ClusterJoin> join_cluster(const ServingNodeOptions& options, NodeRole role, uint16_t port,
                                 const ServingNode& node) {
  ClusterJoin join;
  if (options.proxy_urls.empty()) return join;
  MembershipOptions membership;
  membership.proxy_urls = options.proxy_urls;
  membership.cluster_token = options.cluster_token;
  membership.registration.role = role;
  const std::string host = options.advertise_host.empty() ? options.host : options.advertise_host;
  membership.registration.url = http::join_base_url(host, std::to_string(port));
  membership.registration.model = node.engine->model_info().name;
  if (node.connector != nullptr) {
    membership.registration.kv_descriptor = node.connector->descriptor_base64();
  }
  membership.registration.kv_blocks_total = node.engine->stats().kv_blocks_total;
  membership.registration.tokenizer_sha256 = node.tokenizer_sha256;
  membership.heartbeat_interval = std::chrono::milliseconds(options.heartbeat_interval_ms);
  LlmEngine* engine = node.engine.get();
  join.prefix_cache = std::make_unique<PrefixCacheFanout>(
      prefix_cache_feed(engine, options.engine.block_size), options.engine.block_size,
      options.proxy_urls.size());
  membership.prefix_cache = [fanout = join.prefix_cache.get()](size_t index) {
    return fanout->feed(index);
  };
  if (node.tiered_keys != nullptr) {
    join.tiered_cache = std::make_unique<PrefixCacheFanout>(
        tiered_cache_feed(node.tiered_keys, options.engine.block_size), options.engine.block_size,
        options.proxy_urls.size());
    membership.tiered_cache = [fanout = join.tiered_cache.get()](size_t index) {
      return fanout->feed(index);
    };
  }
  if (options.exit_when_drained) {
    // Runs on an agent's thread; SIGTERM wakes serve_until_shutdown's wait like Ctrl-C does.
    membership.on_retired = [engine] {
      for (ServiceStats stats = engine->stats(); stats.num_running + stats.num_waiting > 0;
           stats = engine->stats()) {
        std::this_thread::sleep_for(kDrainPollInterval);
      }
      PDS_LOG_INFO("drained by the proxy and idle: exiting");
      kill(getpid(), SIGTERM);
    };
  }
  PDS_ASSIGN_OR_RETURN(join.membership,
                       ClusterMembership::start(std::move(membership), [engine] {
                         return node_load(engine->stats());
                       }));
  return join;
}

}  // namespace

void NodeMembership::attach(const ClusterMembership* membership) {
  std::lock_guard lock(mutex_);
  membership_ = membership;
}

bool NodeMembership::draining() const {
  std::lock_guard lock(mutex_);
  return membership_ != nullptr && membership_->draining();
}

Status serve_until_shutdown(const ServingNodeOptions& options, const sigset_t& signals,
                            NodeRole role, ServingNode& node, http::RouteTable router,
                            const std::function<void(uint16_t port)>& announce) {
  const ModelInfo& model = node.engine->model_info();
  OpenApiFacts facts{{model.name}, model.vocab_size};
  http::add_openapi_route(router, [facts] { return facts; });
  if (!options.proxy_urls.empty()) {
    // The proxies' cache-aware placement fetches it (proxy/routing/cluster_tokenizer.h).
    router.add("GET", "/cluster/tokenizer",
               guarded({options.cluster_token, {}}, RouteAccess::kCluster,
                       [files = node.tokenizer_files](const http::HttpRequest&,
                                                      std::shared_ptr<http::ResponseChannel> ch) {
                         ch->send({200, "application/json", {}, files->to_json().dump()});
                       }));
  }
  Result<std::unique_ptr<http::HttpServer>> server =
      http::HttpServer::start(http_server_options(options), std::move(router));
  if (!server.ok()) {
    node.engine->stop();
    return server.status();
  }
  Result<ClusterJoin> join = join_cluster(options, role, (*server)->port(), node);
  if (!join.ok()) {
    (*server)->stop();
    node.engine->stop();
    return join.status();
  }
  node.membership.attach(join->membership.get());
  announce((*server)->port());

  std::optional<StatsLogger> stats_logger;
  if (options.log_stats_interval_s > 0) {
    stats_logger.emplace([engine = node.engine.get()] { return engine->stats(); },
                         std::chrono::seconds(options.log_stats_interval_s));
  }
  const int received = wait_for_shutdown_signal(signals);
  stats_logger.reset();
  PDS_LOG_INFO("signal " + std::to_string(received) + ": shutting down");
  node.membership.attach(nullptr);
  join->membership.reset();  // leaves the cluster first, so no proxy routes new work here
  (*server)->stop();    // closes connections: their requests are aborted
  node.engine->stop();  // every request still in flight gets its final delta
  return Status::ok_status();
}

}  // namespace pdserve
