// pdserve-decode: one serving node. Without a prefill pool it serves both phases (the
// colocated baseline): the OpenAI HTTP API over a continuous-batching engine.
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "common/chat/chat_template.h"
#include "common/core/cli.h"
#include "common/core/log.h"
#include "common/http/http_server.h"
#include "common/tokenizer/tokenizer.h"
#include "decode_node/api_server.h"
#include "kernels/model/model_loader.h"
#include "kernels/model/model_runner.h"

namespace pdserve {
namespace {

struct Options {
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
};

// Blocks SIGINT/SIGTERM in every thread (call before starting any) and waits for one.
int wait_for_shutdown_signal(const sigset_t& signals) {
  int received = 0;
  sigwait(&signals, &received);
  return received;
}

Status run(const Options& options) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (options.port < 0 || options.port > 65535) return invalid_argument("--port must be in [0, 65535]");
  ModelLoadOptions load_options;
  PDS_ASSIGN_OR_RETURN(load_options.backend.device, parse_device_kind(options.device));
  load_options.backend.num_threads = options.threads;
  if (!options.dtype.empty()) {
    PDS_ASSIGN_OR_RETURN(DType dtype, parse_dtype(options.dtype));
    load_options.dtype = dtype;
  }
  EngineConfig engine_config = options.engine;
  PDS_ASSIGN_OR_RETURN(engine_config.kv_cache_dtype, parse_kv_cache_dtype(options.kv_cache_dtype));
  PDS_ASSIGN_OR_RETURN(LoadedModel loaded, load_model(options.model, load_options));
  PDS_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::from_model_dir(loaded.model_dir));
  PDS_ASSIGN_OR_RETURN(ChatTemplate chat_template,
                       ChatTemplate::from_tokenizer_config(loaded.model_dir / "tokenizer_config.json"));
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<LlmEngine> engine, make_llm_engine(loaded, tokenizer, engine_config));
  PDS_RETURN_IF_ERROR(engine->start());

  ApiServer api(*engine, tokenizer, chat_template);
  http::Router router;
  api.register_routes(router);
  http::ServerOptions server_options;
  server_options.host = options.host;
  server_options.port = static_cast<uint16_t>(options.port);
  server_options.threads = options.http_threads;
  server_options.max_body_bytes = options.max_body_bytes;
  server_options.header_timeout = std::chrono::milliseconds(options.header_timeout_ms);
  server_options.idle_timeout = std::chrono::milliseconds(options.idle_timeout_ms);
  Result<std::unique_ptr<http::HttpServer>> server = http::HttpServer::start(server_options, std::move(router));
  if (!server.ok()) {
    engine->stop();
    return server.status();
  }
  std::printf("pdserve-decode: serving %s on http://%s:%u (device %s)\n",
              engine->model_info().name.c_str(), options.host.c_str(), (*server)->port(),
              options.device.c_str());
  std::fflush(stdout);

  const int received = wait_for_shutdown_signal(signals);
  PDS_LOG_INFO("signal " + std::to_string(received) + ": shutting down");
  (*server)->stop();  // closes connections: their requests are aborted
  engine->stop();     // every request still in flight gets its final delta
  return {};
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  pdserve::Options options;
  CLI::App app{"pdserve-decode: a serving node with the OpenAI HTTP API (colocated prefill + decode)"};
  app.add_option("--model", options.model, "Model folder, or a hub id in the local HF cache")->required();
  app.add_option("--device", options.device, "cpu or cuda")->capture_default_str();
  app.add_option("--dtype", options.dtype, "Weight dtype: bfloat16, float16 or float32 (default: the checkpoint's)");
  app.add_option("--threads", options.threads, "CPU compute threads (0: all cores)")->capture_default_str();
  app.add_option("--host", options.host, "Address to listen on")->capture_default_str();
  app.add_option("--port", options.port, "Port to listen on (0: any free port, printed at start)")->capture_default_str();
  app.add_option("--http-threads", options.http_threads, "HTTP I/O threads")->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--max-body-bytes", options.max_body_bytes, "Largest request body; larger gets 413")->capture_default_str();
  app.add_option("--header-timeout-ms", options.header_timeout_ms,
                 "Deadline for a request's headers (drops slowloris clients)")
      ->capture_default_str()
      ->check(CLI::Range(1, 3'600'000));
  app.add_option("--idle-timeout-ms", options.idle_timeout_ms, "Keep-alive idle deadline")
      ->capture_default_str()
      ->check(CLI::Range(1, 3'600'000));
  app.add_option("--served-model-name", options.engine.served_model_name, "Model name in the API (default: the model folder's name)");
  app.add_option("--kv-cache-memory-gib", options.engine.kv_cache_memory_gib, "Memory for the paged KV cache")->capture_default_str();
  app.add_option("--kv-cache-dtype", options.kv_cache_dtype,
                 "KV cache element type: auto (the backend's activation dtype), bfloat16 or float32")
      ->capture_default_str();
  app.add_option("--block-size", options.engine.block_size, "Tokens per KV block")->capture_default_str();
  app.add_option("--max-num-batched-tokens", options.engine.max_num_batched_tokens, "Token budget of one engine step")->capture_default_str();
  app.add_option("--max-num-seqs", options.engine.max_num_seqs, "Most sequences running at once")->capture_default_str();
  app.add_option("--max-waiting", options.engine.max_num_waiting, "Most queued requests; more get 429 with Retry-After")->capture_default_str();
  app.add_option("--max-model-len", options.engine.max_model_len, "Context length (0: the model's max_position_embeddings)")->capture_default_str();
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  pdserve::Status status = pdserve::capture_status([&] { return pdserve::run(options); });
  return status.ok() ? 0 : pdserve::report_cli_error(status);
}
