// The OpenAI API over an InferenceService: POST /v1/completions, POST /v1/chat/completions
// (streaming or not), GET /v1/models, GET /health, GET /metrics. A request with n choices or
// several prompts fans out into one engine request per choice; a client that disconnects
// aborts all of them. Every accepted request ends with a response, or for a stream with an
// SSE error event and [DONE].
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/chat/chat_template.h"
#include "common/http/router.h"
#include "common/metrics/metrics.h"
#include "common/tokenizer/tokenizer.h"

namespace pdserve {

class InferenceService;
struct EngineDelta;

class ApiServer {
 public:
  // The service, tokenizer and template must outlive the server and its routes.
  ApiServer(InferenceService& service, const Tokenizer& tokenizer,
            const ChatTemplate& chat_template);

  void register_routes(http::Router& router);
  metrics::Registry& metrics() { return metrics_; }

  struct Generation;  // one client request in flight (defined in api_server.cpp)

 private:
  void handle_generation(const http::HttpRequest& request,
                         const std::shared_ptr<http::ResponseChannel>& channel, bool chat);
  void handle_models(const std::shared_ptr<http::ResponseChannel>& channel);
  void handle_metrics(const std::shared_ptr<http::ResponseChannel>& channel);
  void count_response(int status);
  void record_finished(const EngineDelta& delta);

  InferenceService& service_;
  const Tokenizer& tokenizer_;
  const ChatTemplate& chat_template_;
  metrics::Registry metrics_;
  std::atomic<uint64_t> next_id_{0};
};

}  // namespace pdserve
