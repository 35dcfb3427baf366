#include "bench/serving/stream_client.h"

#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <system_error>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

namespace pdserve::bench {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;  // keeps the order of the server's timeline fields

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Connects `stream` to the endpoint; its expiry must already be set.
asio::awaitable<beast::error_code> connect(beast::tcp_stream& stream, const Endpoint& endpoint) {
  beast::error_code ec;
  tcp::resolver resolver(co_await asio::this_coro::executor);
  auto results = co_await resolver.async_resolve(endpoint.host, endpoint.port,
                                                 asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return ec;
  co_await stream.async_connect(results, asio::redirect_error(asio::use_awaitable, ec));
  co_return ec;
}

std::string describe(const beast::error_code& ec, std::string_view stage) {
  if (ec == beast::error::timeout) return std::string(stage) + ": deadline exceeded";
  return std::string(stage) + ": " + ec.message();
}

// The generated text a stream chunk's first choice carries: "text" of a completion, or the
// delta's "content" and "reasoning_content" of a chat completion (a reasoning model's first
// tokens are reasoning; the role chunk carries none). Empty when it carries none.
std::string chunk_text(const Json& choice, ApiRoute route) {
  const auto string_or_empty = [](const Json& object, const char* key) {
    const auto value = object.find(key);
    return value != object.end() && value->is_string() ? value->get<std::string>() : std::string();
  };
  if (!choice.is_object()) return {};
  if (route == ApiRoute::kCompletions) return string_or_empty(choice, "text");
  const auto delta = choice.find("delta");
  if (delta == choice.end() || !delta->is_object()) return {};
  return string_or_empty(*delta, "reasoning_content") + string_or_empty(*delta, "content");
}

// Reads the server-sent events of one completion stream and times its chunks.
class StreamTimer {
 public:
  StreamTimer(RequestOutcome& outcome, ApiRoute route, Clock::time_point sent)
      : outcome_(outcome), route_(route), sent_(sent), last_chunk_(sent) {}

  // Feeds body bytes; complete events ("...\n\n") are handled at once.
  void feed(std::string_view bytes) {
    pending_.append(bytes);
    for (;;) {
      const size_t end = pending_.find("\n\n");
      if (end == std::string::npos) return;
      handle_event(std::string_view(pending_).substr(0, end));
      pending_.erase(0, end + 2);
    }
  }

  bool done() const { return done_; }
  bool saw_usage() const { return saw_usage_; }
  const std::string& error() const { return error_; }
  Clock::time_point last_chunk() const { return last_chunk_; }

 private:
  void handle_event(std::string_view event) {
    for (size_t begin = 0; begin < event.size();) {
      size_t end = event.find('\n', begin);
      if (end == std::string_view::npos) end = event.size();
      std::string_view line = event.substr(begin, end - begin);
      begin = end + 1;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (!line.starts_with("data:")) continue;  // comments, event names
      line.remove_prefix(5);
      if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      handle_data(line);
    }
  }

  void handle_data(std::string_view data) {
    if (data == "[DONE]") {
      done_ = true;
      return;
    }
    const Json chunk = Json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (chunk.is_discarded() || !chunk.is_object()) {
      set_error("malformed stream chunk: " + std::string(data.substr(0, 200)));
      return;
    }
    if (const auto error = chunk.find("error"); error != chunk.end()) {
      set_error("server error in stream: " + error->dump());
      return;
    }
    if (const auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
      outcome_.prompt_tokens = usage->value("prompt_tokens", -1);
      outcome_.output_tokens = usage->value("completion_tokens", -1);
      if (const auto timeline = usage->find("pdserve_timeline"); timeline != usage->end()) {
        outcome_.timeline = *timeline;
      }
      saw_usage_ = true;
    }
    const auto choices = chunk.find("choices");
    if (choices == chunk.end() || !choices->is_array() || choices->empty()) return;
    const std::string text = chunk_text((*choices)[0], route_);
    if (text.empty()) return;
    const Clock::time_point now = Clock::now();
    outcome_.generated_text += text;
    if (outcome_.text_chunks == 0) {
      outcome_.ttft_s = seconds_between(sent_, now);
    } else {
      outcome_.itl_s.push_back(seconds_between(last_chunk_, now));
    }
    ++outcome_.text_chunks;
    last_chunk_ = now;
  }

  void set_error(std::string message) {
    if (error_.empty()) error_ = std::move(message);
  }

  RequestOutcome& outcome_;
  ApiRoute route_;
  Clock::time_point sent_;
  Clock::time_point last_chunk_;
  std::string pending_;
  std::string error_;
  bool done_ = false;
  bool saw_usage_ = false;
};

std::string request_body(const StreamRequest& request) {
  Json body;
  body["model"] = request.model;
  if (request.route == ApiRoute::kChatCompletions) {
    // The prompt is the user turn, after the history; the server applies the model's chat
    // template.
    Json messages = Json::array();
    for (const ChatMessage& message : request.history) {
      messages.push_back(Json{{"role", message.role}, {"content", message.content}});
    }
    messages.push_back(Json{{"role", "user"}, {"content", request.request->prompt_text}});
    body["messages"] = std::move(messages);
    body["max_completion_tokens"] = request.request->output_len;
  } else {
    if (request.request->prompt_text.empty()) {
      body["prompt"] = request.request->prompt;
    } else {
      body["prompt"] = request.request->prompt_text;
    }
    body["max_tokens"] = request.request->output_len;
  }
  body["temperature"] = 0;
  body["ignore_eos"] = true;
  body["stream"] = true;
  body["stream_options"] = Json{{"include_usage", true}};
  return body.dump();
}

// The checks that make the token counts trustworthy: the server generated exactly what was
// asked (ignore_eos), read the whole prompt, and sent no more text chunks than tokens.
// A text prompt's length is whatever the server's tokenizer makes of it (at least one token).
std::string check_counts(const RequestOutcome& outcome, const BenchRequest& request) {
  if (!request.prompt_text.empty()) {
    if (outcome.prompt_tokens < 1) {
      return "usage.prompt_tokens is " + std::to_string(outcome.prompt_tokens) +
             " for a text prompt";
    }
  } else if (const auto expected_prompt = static_cast<int>(request.prompt.size());
             outcome.prompt_tokens != expected_prompt) {
    return "usage.prompt_tokens is " + std::to_string(outcome.prompt_tokens) + ", sent " +
           std::to_string(expected_prompt);
  }
  if (outcome.output_tokens != request.output_len) {
    return "usage.completion_tokens is " + std::to_string(outcome.output_tokens) + ", asked for " +
           std::to_string(request.output_len) + " with ignore_eos";
  }
  if (outcome.text_chunks < 1 || outcome.text_chunks > outcome.output_tokens) {
    return std::to_string(outcome.text_chunks) + " chunks with text for " +
           std::to_string(outcome.output_tokens) + " tokens";
  }
  return {};
}

// Retry-After in its delay-seconds form (RFC 9110 10.2.3); an HTTP-date or garbage: none.
std::optional<double> retry_after_seconds(const http::response<http::string_body>& response) {
  const auto field = response.find(http::field::retry_after);
  if (field == response.end()) return std::nullopt;
  const std::string_view text(field->value().data(), field->value().size());
  unsigned seconds = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), seconds);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return seconds;
}

}  // namespace

Result<Endpoint> parse_base_url(const std::string& url) {
  Result<Endpoint> endpoint = pdserve::http::parse_base_url(url);
  if (!endpoint.ok()) return endpoint.status().with_context("--base-url");
  return endpoint;
}

Result<ApiRoute> parse_api_route(const std::string& path) {
  if (path == api_route_path(ApiRoute::kCompletions)) return ApiRoute::kCompletions;
  if (path == api_route_path(ApiRoute::kChatCompletions)) return ApiRoute::kChatCompletions;
  return invalid_argument("--endpoint must be /v1/completions or /v1/chat/completions, got '" +
                          path + "'");
}

const char* api_route_path(ApiRoute route) {
  return route == ApiRoute::kChatCompletions ? "/v1/chat/completions" : "/v1/completions";
}

asio::awaitable<RequestOutcome> stream_completion(const Endpoint& endpoint,
                                                  const StreamRequest& request,
                                                  Clock::time_point run_start) {
  RequestOutcome outcome;
  const Clock::time_point sent = Clock::now();
  outcome.start_s = seconds_between(run_start, sent);
  auto fail = [&](std::string message) {
    outcome.success = false;
    outcome.error = std::move(message);
    outcome.e2e_s = seconds_between(sent, Clock::now());
    return outcome;
  };

  beast::tcp_stream stream(co_await asio::this_coro::executor);
  stream.expires_after(request.timeout);  // one deadline for connect, send and the whole stream
  beast::error_code ec = co_await connect(stream, endpoint);
  if (ec) co_return fail(describe(ec, "connect"));

  http::request<http::string_body> http_request(http::verb::post, api_route_path(request.route),
                                                11);
  http_request.set(http::field::host, endpoint.host);
  http_request.set(http::field::content_type, "application/json");
  http_request.set(http::field::accept, "text/event-stream");
  http_request.set("X-Pdserve-Timeline", "1");
  if (!request.api_key.empty()) {
    http_request.set(http::field::authorization, "Bearer " + request.api_key);
  }
  http_request.body() = request_body(request);
  http_request.prepare_payload();
  co_await http::async_write(stream, http_request, asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return fail(describe(ec, "send"));

  StreamTimer timer(outcome, request.route, sent);
  http::response_parser<http::string_body> parser;
  // No limit; not boost::none, which Boost 1.74 compares as below any Content-Length (every
  // error answer with a Content-Length would read as "body limit exceeded").
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  auto on_chunk = [&timer](std::uint64_t, beast::string_view body, beast::error_code&) {
    timer.feed(std::string_view(body.data(), body.size()));
    return body.size();
  };
  beast::flat_buffer buffer;
  co_await http::async_read_header(stream, buffer, parser,
                                   asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return fail(describe(ec, "read response header"));
  // Only a 200 is a stream to time; an error body is kept whole for the report.
  if (parser.get().result_int() == 200) parser.on_chunk_body(on_chunk);
  while (!parser.is_done() && timer.error().empty()) {
    co_await http::async_read_some(stream, buffer, parser,
                                   asio::redirect_error(asio::use_awaitable, ec));
    if (ec) break;
  }
  const Clock::time_point ended = Clock::now();
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);

  const unsigned status = parser.get().result_int();
  outcome.http_status = static_cast<int>(status);
  if (status == 429) outcome.retry_after_s = retry_after_seconds(parser.get());
  if (status != 200) {
    co_return fail("HTTP " + std::to_string(status) + ": " + parser.get().body().substr(0, 300));
  }
  if (!timer.error().empty()) co_return fail(timer.error());
  if (ec) {
    co_return fail(describe(ec, "stream after " + std::to_string(outcome.text_chunks) + " chunks"));
  }
  if (!timer.done()) co_return fail("stream ended without data: [DONE]");
  if (!timer.saw_usage())
    co_return fail("stream had no usage chunk (stream_options.include_usage)");
  outcome.e2e_s = seconds_between(sent, ended);
  outcome.error = check_counts(outcome, *request.request);
  outcome.success = outcome.error.empty();
  co_return outcome;
}

asio::awaitable<Result<std::string>> fetch_text(const Endpoint& endpoint, const std::string& target,
                                                Clock::duration timeout,
                                                const std::string& api_key) {
  beast::tcp_stream stream(co_await asio::this_coro::executor);
  stream.expires_after(timeout);
  const std::string where = "GET http://" + endpoint.host + ":" + endpoint.port + target;
  beast::error_code ec = co_await connect(stream, endpoint);
  if (ec) co_return unavailable(where + ": " + describe(ec, "connect"));
  http::request<http::empty_body> http_request(http::verb::get, target, 11);
  http_request.set(http::field::host, endpoint.host);
  if (!api_key.empty()) http_request.set(http::field::authorization, "Bearer " + api_key);
  co_await http::async_write(stream, http_request, asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return unavailable(where + ": " + describe(ec, "send"));
  beast::flat_buffer buffer;
  http::response<http::string_body> response;
  co_await http::async_read(stream, buffer, response,
                            asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return unavailable(where + ": " + describe(ec, "read"));
  if (response.result_int() != 200) {
    co_return unavailable(where + ": HTTP " + std::to_string(response.result_int()));
  }
  co_return std::move(response.body());
}

}  // namespace pdserve::bench
