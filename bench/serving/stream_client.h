// One streaming completion or chat completion request over HTTP/1.1 (Boost.Beast on Asio
// coroutines), timed per streamed chunk. It asks for the server's per-request timeline
// (X-Pdserve-Timeline: 1; the proxy gives it without node addresses unless the key is the
// cluster token). Every connection carries a deadline, so a dead or stalled
// server produces a failed outcome instead of a hang.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without it
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <nlohmann/json.hpp>

#include "bench/serving/workload.h"
#include "common/core/status.h"
#include "common/http/http_client.h"

namespace pdserve::bench {

// http://HOST[:PORT]; the API routes are appended to it.
using Endpoint = http::BaseUrl;

// http::parse_base_url, its errors naming --base-url.
Result<Endpoint> parse_base_url(const std::string& url);

// The API a request goes to (vLLM's --endpoint).
enum class ApiRoute { kCompletions, kChatCompletions };

// "/v1/completions" or "/v1/chat/completions"; anything else is INVALID_ARGUMENT.
Result<ApiRoute> parse_api_route(const std::string& path);
const char* api_route_path(ApiRoute route);

struct RequestOutcome {
  bool success = false;
  std::string error;           // why it failed; empty on success
  int http_status = 0;         // of the answer (0: none came)
  // A 429's Retry-After in seconds (delay-seconds form), when it sent one.
  std::optional<double> retry_after_s;
  int retries = 0;  // HTTP 429 answers retried before this outcome (RunOptions::retry_429_for)
  int prompt_tokens = 0;       // from the usage chunk
  int output_tokens = 0;       // from the usage chunk, checked against the chunks
  int text_chunks = 0;         // streamed chunks that carried text
  std::string generated_text;  // the streamed text (chat: content and reasoning_content)
  double start_s = 0;          // when the request was first sent, from the start of the run
  // From start_s (so a retried request's includes its 429 answers and the waits after them).
  double ttft_s = 0;           // to the first chunk with text
  double e2e_s = 0;            // to the end of the stream
  std::vector<double> itl_s;   // between consecutive chunks with text
  // The server's usage.pdserve_timeline (spans relative to the request's arrival at the
  // proxy), copied as sent; null when the server sent none.
  nlohmann::ordered_json timeline;
};

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

struct StreamRequest {
  ApiRoute route = ApiRoute::kCompletions;
  std::string model;
  const BenchRequest* request = nullptr;
  // Chat: the messages sent before the request's user turn (a multi-turn conversation so far).
  std::vector<ChatMessage> history;
  std::chrono::steady_clock::duration timeout{};  // for the whole exchange
  std::string api_key;  // sent as "Authorization: Bearer KEY" when not empty
};

// Never throws; failures are reported in the outcome. Times are relative to `run_start`.
boost::asio::awaitable<RequestOutcome> stream_completion(
    const Endpoint& endpoint, const StreamRequest& request,
    std::chrono::steady_clock::time_point run_start);

// GET `target` (e.g. /v1/models) and return its body, with a deadline; `api_key` as in
// StreamRequest.
boost::asio::awaitable<Result<std::string>> fetch_text(const Endpoint& endpoint,
                                                       const std::string& target,
                                                       std::chrono::steady_clock::duration timeout,
                                                       const std::string& api_key);

}  // namespace pdserve::bench
