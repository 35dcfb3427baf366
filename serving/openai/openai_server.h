// The OpenAI front end over an InferenceService (what a serving role composes; the request's
// preparation is generation_request.h, its way to the client generation_stream.h, its series
// request_metrics.h): POST /v1/completions, POST /v1/chat/completions
// (streaming or not), POST /v1/responses, /v1/messages and /v1/messages/count_tokens (translated
// to chat completions: common/api/translated_routes.h), GET /v1/models and /v1/models/{id}, POST /tokenize and /detokenize (vLLM's
// shapes), GET /health, /ready and /version (common/http/service_routes.h), GET /metrics. A request
// with n choices or several prompts fans out into one engine request per choice; a client that
// disconnects, or a choice that fails, aborts all of them. Every accepted request ends with a
// response, or for a stream with an SSE error event and [DONE].
//
// Logprobs: completions `logprobs: N` and chat `logprobs: true, top_logprobs: N` return the
// engine's sampled-token logprobs and top alternatives, whole or per SSE chunk, with token
// strings from Tokenizer::token_bytes; text_offset counts code points of the token strings
// from the start of the choice's text. Prompt logprobs (the engine computes them only for
// requests that ask): a completion with `echo: true` and `logprobs: N` leads its logprobs with
// the prompt's tokens (the first one's logprob and top_logprobs null, as OpenAI and vLLM;
// a stream sends the echo with the first token), and vLLM's `prompt_logprobs: N` (completions
// and chat, not streamed) answers [null, {"<id>": {logprob, rank, decoded_token}}, ...].
//
// Timeline (opt-in): a request with `X-Pdserve-Timeline: 1` gets `usage.pdserve_timeline`
// (request_timeline.h) in its answer or its stream's usage chunk; a stream without a usage
// chunk gets it as the SSE comment `: pdserve_timeline {json}` before [DONE]. The proxy always
// asks. Its trace id continues the request's W3C `traceparent` (or starts a trace); remote
// prefill work gets a child of it.
//
// Access: the OpenAI routes need one of options.access.api_keys, or the cluster token, when
// any key is configured (/tokenize and /detokenize too); /health, /ready, /version, /metrics
// and /openapi.json are open.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/chat/chat_template.h"
#include "common/cluster/cluster_auth.h"
#include "common/engine/inference_service.h"
#include "common/http/route_table.h"
#include "common/http/traceparent.h"
#include "common/metrics/metrics.h"
#include "common/tokenizer/tokenizer.h"
#include "serving/engine_metrics.h"
#include "serving/openai/request_metrics.h"

namespace pdserve {

struct OpenAiOptions {
  // Unknown request fields: a 400 (true) or ignored with one log line (false, as vLLM).
  bool strict_request_fields = false;
  AccessPolicy access;
  // Test only (PDSERVE_TEST_SCRIPTED_OUTPUT=1): a request's `pdserve_test_output` text becomes
  // the first tokens of its output (SamplingParams::scripted_output). Off, it is an unknown field.
  bool test_scripted_output = false;
  // Whether the proxy drained this node (pdserve:node_state); none: a node outside a cluster.
  std::function<bool()> draining = {};
};

class OpenAiServer {
 public:
  // The service, tokenizer and template must outlive the server and its routes, and the
  // service must be stopped (no sink running or left to run) before the server is destroyed:
  // the sinks of requests in flight call into it.
  OpenAiServer(InferenceService& service, const Tokenizer& tokenizer,
               const ChatTemplate& chat_template, OpenAiOptions options = {});
  ~OpenAiServer();

  void register_routes(http::RouteTable& router);

  // Called for every engine request built from an HTTP request, before it is submitted (e.g.
  // to mark it for remote prefill); an error rejects the HTTP request with its status.
  using RequestHook = std::function<Status(const http::HttpRequest&, InferenceRequest&)>;
  void set_request_hook(RequestHook hook) { request_hook_ = std::move(hook); }
  metrics::Registry& metrics() { return metrics_; }

 private:
  void handle_generation(const http::HttpRequest& request,
                         const std::shared_ptr<http::ResponseChannel>& channel, bool chat);
  void handle_models(const std::shared_ptr<http::ResponseChannel>& channel);
  void handle_model(const http::HttpRequest& request,
                    const std::shared_ptr<http::ResponseChannel>& channel);
  void handle_tokenize(const http::HttpRequest& request,
                       const std::shared_ptr<http::ResponseChannel>& channel);
  void handle_detokenize(const http::HttpRequest& request,
                         const std::shared_ptr<http::ResponseChannel>& channel);
  nlohmann::ordered_json model_card() const;
  void handle_metrics(const std::shared_ptr<http::ResponseChannel>& channel);
  // Counts and sends an OpenAI error body.
  void reply_error(http::ResponseChannel& channel, const ApiError& error);
  void abort_requests(const std::vector<std::string>& engine_ids);
  // A new response's serial: id_prefix_ then the counter, in hex.
  std::string next_serial();

  InferenceService& service_;
  const Tokenizer& tokenizer_;
  const ChatTemplate& chat_template_;
  const OpenAiOptions options_;
  metrics::Registry metrics_;
  RequestMetrics request_metrics_;
  EngineMetrics engine_metrics_;
  RequestHook request_hook_;
  http::TraceIdGenerator trace_ids_;
  // Response ids are id_prefix_ (random per server) then a counter, so they repeat neither
  // across restarts nor across the nodes behind one proxy.
  const uint64_t id_prefix_;
  std::atomic<uint64_t> next_id_{0};
};

}  // namespace pdserve
