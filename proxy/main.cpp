// pdserve-proxy: the front door of a disaggregated cluster. Serves the OpenAI API, routes each
// request to a decode node and its prefill to a prefill node, and tracks the nodes that
// register with it (or are listed with --prefill / --decode).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/cluster/cluster_auth.h"
#include "common/core/cli.h"
#include "common/core/log.h"
#include "common/core/shutdown_signals.h"
#include "common/http/http_client.h"
#include "common/http/http_server.h"
#include "common/http/openapi_route.h"
#include "common/tokenizer/tokenizer_files.h"
#include "proxy/proxy_server.h"
#include "proxy/routing/placement.h"

namespace pdserve::proxy {
namespace {

struct Options {
  std::string host = "127.0.0.1";
  int port = 8080;
  int http_threads = 2;
  int upstream_threads = 2;
  std::vector<std::string> prefill_urls;
  std::vector<std::string> decode_urls;
  std::string cluster_token;
  bool insecure_no_cluster_token = false;
  std::vector<std::string> api_keys;
  int heartbeat_timeout_ms = 3'000;
  int request_timeout_s = 600;
  int first_byte_timeout_s = 300;
  int stream_idle_timeout_s = 120;
  std::string stream_resume = "on";
  size_t max_body_bytes = size_t{16} << 20;
  AdvisorOptions advice;
  int advice_window_s = 60;
  size_t trace_capacity = 1000;
  bool ready_needs_prefill = false;
  std::string trace_file;
  std::string otlp_traces_endpoint;
  int otlp_batch_delay_ms = 1000;
  int otlp_timeout_ms = 5000;
  size_t otlp_max_queue_spans = 4096;
  std::string tokenizer_dir;
  bool no_cache_aware_routing = false;
  size_t route_max_prompt_bytes = 8'192;
  RegistryOptions registry;
  PlacementPolicy placement;
};

// --otlp-traces-endpoint, else $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; service.name from
// $OTEL_SERVICE_NAME. Nothing to do without an endpoint.
Status export_otlp_traces(const Options& options, ProxyServer& proxy) {
  std::string url = options.otlp_traces_endpoint;
  if (url.empty()) {
    if (const char* from_env = std::getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) url = from_env;
  }
  if (url.empty()) return {};
  OtlpExporterOptions otlp;
  Result<OtlpEndpoint> endpoint = parse_otlp_traces_endpoint(url);
  if (!endpoint.ok()) return endpoint.status().with_context("--otlp-traces-endpoint");
  otlp.endpoint = std::move(endpoint).value();
  if (const char* service = std::getenv("OTEL_SERVICE_NAME"); service && *service) {
    otlp.service_name = service;
  }
  otlp.batch_delay = std::chrono::milliseconds(options.otlp_batch_delay_ms);
  otlp.post_timeout = std::chrono::milliseconds(options.otlp_timeout_ms);
  otlp.max_queue_spans = options.otlp_max_queue_spans;
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<OtlpExporter> exporter,
                       OtlpExporter::create(otlp, proxy.metrics()));
  PDS_LOG_INFO("exporting request spans over OTLP/HTTP to " + otlp.endpoint.base.to_string() +
               otlp.endpoint.path + " as service " + otlp.service_name);
  proxy.export_traces(std::move(exporter));
  return {};
}

Status run(const Options& options) {
  const sigset_t signals = block_shutdown_signals();

  PDS_RETURN_IF_ERROR(require_cluster_token(options.cluster_token,
                                            options.insecure_no_cluster_token, "pdserve-proxy"));
  RegistryOptions registry_options = options.registry;
  registry_options.heartbeat_timeout = std::chrono::milliseconds(options.heartbeat_timeout_ms);
  NodeRegistry registry(registry_options);
  for (const std::string& url : options.prefill_urls) {
    PDS_RETURN_IF_ERROR(
        registry.add_static(NodeRole::kPrefill, url).status().with_context("--prefill"));
  }
  for (const std::string& url : options.decode_urls) {
    PDS_RETURN_IF_ERROR(
        registry.add_static(NodeRole::kDecode, url).status().with_context("--decode"));
  }
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<http::HttpClient> client,
                       http::HttpClient::create(options.upstream_threads));
  ProxyOptions proxy_options;
  proxy_options.access = {options.cluster_token, options.api_keys};
  proxy_options.request_timeout = std::chrono::seconds(options.request_timeout_s);
  proxy_options.first_byte_timeout = std::chrono::seconds(options.first_byte_timeout_s);
  proxy_options.stream_idle_timeout = std::chrono::seconds(options.stream_idle_timeout_s);
  proxy_options.stream_resume = options.stream_resume == "on";
  proxy_options.advice = options.advice;
  proxy_options.advice.window = std::chrono::seconds(options.advice_window_s);
  proxy_options.trace_capacity = options.trace_capacity;
  proxy_options.ready_needs_prefill = options.ready_needs_prefill;
  proxy_options.placement = options.placement;
  proxy_options.tokenizer.enabled = !options.no_cache_aware_routing;
  proxy_options.tokenizer.max_text_bytes = options.route_max_prompt_bytes;
  if (!options.tokenizer_dir.empty()) {
    Result<PromptTokenizer> prompt_tokenizer =
        PromptTokenizer::load(options.tokenizer_dir, options.route_max_prompt_bytes);
    if (!prompt_tokenizer.ok()) return prompt_tokenizer.status().with_context("--tokenizer");
    Result<TokenizerFiles> files = TokenizerFiles::read(options.tokenizer_dir);
    if (!files.ok()) return files.status().with_context("--tokenizer");
    proxy_options.tokenizer.fixed =
        std::make_shared<const PromptTokenizer>(std::move(prompt_tokenizer).value());
    proxy_options.tokenizer.fixed_sha256 = files->sha256();
    PDS_LOG_INFO("cache-aware placement with --tokenizer (sha256 " +
                 proxy_options.tokenizer.fixed_sha256 + "): nodes advertising another are refused");
  } else if (options.no_cache_aware_routing) {
    PDS_LOG_INFO("--no-cache-aware-routing: requests are placed by load alone");
  } else {
    PDS_LOG_INFO(
        "cache-aware placement: the tokenizer comes from the first node to register "
        "(requests are placed by load alone until it is loaded)");
  }
  ProxyServer proxy(registry, *client, proxy_options);
  if (!options.trace_file.empty()) {
    PDS_RETURN_IF_ERROR(proxy.traces().write_to_file(options.trace_file));
  }
  PDS_RETURN_IF_ERROR(export_otlp_traces(options, proxy));
  http::RouteTable router;
  proxy.register_routes(router);
  http::add_openapi_route(router, [&registry] {
    return OpenApiFacts{registry.decode_models(std::chrono::steady_clock::now()), std::nullopt};
  });
  http::ServerOptions server_options;
  server_options.host = options.host;
  server_options.port = static_cast<uint16_t>(options.port);
  server_options.threads = options.http_threads;
  server_options.max_body_bytes = options.max_body_bytes;
  // Streams can be quiet for long while a prefill runs.
  server_options.write_timeout = std::chrono::seconds(options.request_timeout_s);
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<http::HttpServer> server,
                       http::HttpServer::start(server_options, std::move(router)));
  std::printf("pdserve-proxy: listening on %s (%zu prefill, %zu decode static nodes)\n",
              http::join_base_url(options.host, std::to_string(server->port())).c_str(),
              options.prefill_urls.size(), options.decode_urls.size());
  std::fflush(stdout);

  // Drops silent nodes, and fails over their requests, even when no request comes to trigger
  // it.
  std::mutex mutex;
  std::condition_variable stop_expiry;
  bool stopping = false;
  std::thread expiry([&] {
    std::unique_lock lock(mutex);
    while (!stop_expiry.wait_for(lock, std::chrono::milliseconds(250), [&] { return stopping; })) {
      proxy.expire_nodes(std::chrono::steady_clock::now());
    }
  });

  const int received = wait_for_shutdown_signal(signals);
  PDS_LOG_INFO("signal " + std::to_string(received) + ": shutting down");
  {
    std::lock_guard lock(mutex);
    stopping = true;
  }
  stop_expiry.notify_all();
  expiry.join();
  server->stop();
  client.reset();
  return {};
}

}  // namespace
}  // namespace pdserve::proxy

int main(int argc, char** argv) {
  pdserve::proxy::Options options;
  CLI::App app{
      "pdserve-proxy: OpenAI API front end that routes requests by phase across prefill and decode "
      "nodes"};
  app.add_option("--host", options.host, "Address to listen on")->capture_default_str();
  pdserve::add_log_options(app);
  app.add_option("--port", options.port, "Port to listen on (0: any free port, printed at start)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--http-threads", options.http_threads, "HTTP I/O threads for clients")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--upstream-threads", options.upstream_threads,
                 "I/O threads for calls to the nodes")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--prefill", options.prefill_urls, "Static prefill node(s): http://HOST:PORT");
  app.add_option("--decode", options.decode_urls, "Static decode node(s): http://HOST:PORT");
  app.add_option("--cluster-token", options.cluster_token,
                 "Shared secret that nodes present to register and that the proxy presents to "
                 "them; also read from $PDSERVE_CLUSTER_TOKEN. No whitespace at either end, no "
                 "control character")
      ->envname("PDSERVE_CLUSTER_TOKEN");
  app.add_flag("--insecure-no-cluster-token", options.insecure_no_cluster_token,
               "Run without a cluster token: anyone who can reach the proxy may register a node "
               "(and receive prompts) or read /cluster and /trace. Development only");
  app.add_option("--api-key", options.api_keys,
                 "Client API key(s) for the OpenAI API (Authorization: Bearer KEY or x-api-key: "
                 "KEY; repeat for several); also read from $PDSERVE_API_KEY. Default: the API "
                 "is open")
      ->envname("PDSERVE_API_KEY");
  app.add_option("--heartbeat-timeout-ms", options.heartbeat_timeout_ms,
                 "Drop a registered node after this long without a heartbeat")
      ->capture_default_str()
      ->check(CLI::Range(50, 3'600'000));
  app.add_option("--request-timeout-s", options.request_timeout_s,
                 "Deadline of one forwarded request")
      ->capture_default_str()
      ->check(CLI::Range(1, 86'400));
  app.add_option("--first-byte-timeout-s", options.first_byte_timeout_s,
                 "Deadline for a decode node's response head (covers its queue and the remote "
                 "prefill); then the request goes to another decode node")
      ->capture_default_str()
      ->check(CLI::Range(1, 86'400));
  app.add_option("--stream-idle-timeout-s", options.stream_idle_timeout_s,
                 "Longest silence of a decode node mid-response; then the request fails (or, "
                 "with --stream-resume on, a stream goes on on another decode node)")
      ->capture_default_str()
      ->check(CLI::Range(1, 86'400));
  app.add_option("--stream-resume", options.stream_resume,
                 "Continue a stream on another decode node when its node fails "
                 "mid-stream (the nodes then send a checkpoint before each event)")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--max-body-bytes", options.max_body_bytes,
                 "Largest request body; larger gets 413")
      ->capture_default_str();
  app.add_option("--slo-ttft-ms", options.advice.slo_ttft_ms,
                 "Time-to-first-token SLO for GET /cluster/advice")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--slo-tpot-ms", options.advice.slo_tpot_ms,
                 "Time-per-output-token SLO for GET /cluster/advice")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--advice-window-s", options.advice_window_s,
                 "Finished requests GET /cluster/advice looks back over")
      ->capture_default_str()
      ->check(CLI::Range(1, 86'400));
  app.add_option("--kv-block-tokens", options.advice.kv_block_tokens,
                 "The decode nodes' --block-size, for the advice's decode batch")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--decode-max-batch", options.advice.decode_max_batch,
                 "The decode nodes' --max-num-seqs, for the advice's decode batch")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  app.add_flag("--ready-needs-prefill", options.ready_needs_prefill,
               "GET /ready answers 503 until a prefill node is up too (by default one decode "
               "node suffices: decode nodes prefill themselves)");
  app.add_option("--trace-capacity", options.trace_capacity,
                 "Finished requests' timelines kept for GET /trace")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1'000'000}));
  app.add_option("--trace-file", options.trace_file,
                 "Append each finished request's Chrome trace events to this file (truncated at "
                 "start; loads in Perfetto even when cut, see docs/TRACING.md)");
  app.add_option("--otlp-traces-endpoint", options.otlp_traces_endpoint,
                 "Export each request's spans as OpenTelemetry traces over OTLP/HTTP JSON to this "
                 "URL (http://HOST:PORT/v1/traces; a URL without a path gets /v1/traces). "
                 "Default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else none (docs/TRACING.md)");
  app.add_option("--otlp-batch-delay-ms", options.otlp_batch_delay_ms,
                 "Longest wait before queued spans are sent")
      ->capture_default_str()
      ->check(CLI::Range(1, 600'000));
  app.add_option("--otlp-timeout-ms", options.otlp_timeout_ms,
                 "Deadline of one POST to the collector; a batch past it is dropped")
      ->capture_default_str()
      ->check(CLI::Range(1, 600'000));
  app.add_option("--otlp-max-queue-spans", options.otlp_max_queue_spans,
                 "Spans waiting for the collector at most; a request's spans beyond it are "
                 "dropped (pdserve:otlp_spans_dropped_total)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1'000'000}));
  CLI::Option* tokenizer =
      app.add_option("--tokenizer", options.tokenizer_dir,
                     "Model folder (tokenizer.json, tokenizer_config.json) the proxy tokenizes "
                     "prompts with, as the nodes do, for cache-aware routing; registering nodes "
                     "must advertise the same tokenizer. Default: fetched from the first node "
                     "to register (GET /cluster/tokenizer, cluster token)");
  app.add_flag("--no-cache-aware-routing", options.no_cache_aware_routing,
               "Place requests by load alone: no tokenizer is fetched or loaded, and prefill "
               "placement is not chosen per request")
      ->excludes(tokenizer);
  app.add_option("--route-max-prompt-bytes", options.route_max_prompt_bytes,
                 "Cache-aware routing tokenizes at most this many leading bytes of a prompt "
                 "(bodies over 4x this are placed by load alone)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{256}, size_t{16} << 20));
  app.add_option("--route-prefix-weight", options.registry.weights.prefix,
                 "Routing cost: weight of the prompt's cached-prefix fraction on a node (both "
                 "pools; 0: cache-unaware), see proxy/README.md")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--route-tier-hit-weight", options.registry.weights.tier_hit,
                 "Routing cost: worth of a prompt block a node holds only in its KV tiers (host "
                 "memory, disk) against one in its pool (1) and a miss (0), see proxy/README.md")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--route-kv-weight", options.registry.weights.kv,
                 "Routing cost of a decode node: weight of its KV usage (0..1)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--route-sequence-weight", options.registry.weights.sequence,
                 "Routing cost of a decode node: weight of each sequence running, waiting or in "
                 "flight there")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--route-prefill-queue-weight", options.registry.weights.prefill_queue,
                 "Routing cost of a prefill node: weight of its outstanding prompt tokens, in "
                 "lengths of the prompt being placed")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  app.add_option(
         "--local-prefill-max-uncached-tokens", options.placement.local_max_uncached_tokens,
         "With cache-aware routing: prefill on the decode node when at most this many of the "
         "prompt's tokens are not cached there (0: only a prompt cached in full)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option(
         "--prefill-queue-max-tokens", options.placement.max_prefill_queue_tokens,
         "With cache-aware routing: prefill on the decode node when the best prefill node has "
         "more outstanding prompt tokens than this (0: no limit)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--prefix-keys-per-node", options.registry.prefix_keys_per_node,
                 "Most prefix-cache block keys the proxy keeps per node, for its pool and again "
                 "for its KV tiers (least recent dropped first)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{0}, size_t{1} << 24));
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  pdserve::Status status = pdserve::capture_status([&] { return pdserve::proxy::run(options); });
  return status.ok() ? 0 : pdserve::report_cli_error(status);
}
