// An HTTP/1.1 client on Boost.Asio/Beast for the cluster's internal calls (proxy -> nodes,
// decode -> prefill, node -> proxy registration): its own I/O threads, one connection per
// call, a deadline on every call covering connect, send and the whole response (and optional
// deadlines for the response head and for silence mid-body), responses
// streamed to callbacks as they arrive, and cancellation from any thread. Callbacks run on the
// client's I/O threads and must not block. Interim answers (1xx, e.g. 100 Continue or 103 Early
// Hints) are read and dropped, under the head deadline: callers see only the final answer. A
// 101 Switching Protocols fails the call (Unavailable): no call asks for an upgrade.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/core/status.h"
#include "common/http/http_message.h"

namespace pdserve::http {

// HOST as a URL or a Host header writes it: an IPv6 literal (it has colons) in brackets.
std::string url_host(std::string_view host);
// "http://HOST:PORT", e.g. "http://10.0.0.5:8001", "http://node-1:8001", "http://[::1]:8001".
std::string join_base_url(std::string_view host, std::string_view port);

// http://HOST[:PORT] (a trailing slash is allowed, a path is not); an IPv6 literal HOST is
// written in brackets and held without them (what the resolver takes).
struct BaseUrl {
  std::string host;
  std::string port = "80";

  std::string to_string() const { return join_base_url(host, port); }
  bool operator==(const BaseUrl&) const = default;
};
// InvalidArgument naming what is wrong with `url`.
Result<BaseUrl> parse_base_url(std::string_view url);

struct ClientRequest {
  std::string method = "GET";
  std::string target = "/";
  HeaderList headers;
  std::string body;
  std::string content_type = "application/json";
  std::chrono::steady_clock::duration timeout = std::chrono::seconds(30);  // the whole call
  // Tighter deadlines within it: from the request sent to the response head, and the longest
  // silence while the body streams. A server that accepts and never answers, or freezes
  // mid-stream, fails the call with DeadlineExceeded naming the phase.
  std::optional<std::chrono::steady_clock::duration> head_timeout;
  std::optional<std::chrono::steady_clock::duration> idle_timeout;
  // fetch() only: the most body bytes it holds. A longer body fails the call with
  // ResourceExhausted (what comes past the bound is not kept), so no peer can make the caller
  // buffer without bound. Streamed calls bound what they keep themselves.
  size_t max_fetch_body_bytes = size_t{64} << 20;
};

struct ClientResponse {
  int status = 0;
  HeaderList headers;
  std::string body;

  std::optional<std::string_view> header(std::string_view name) const;
};

// How a streamed call reports. on_head once (status and headers), on_body for each piece of
// the body as it arrives, then on_done once with the outcome: OK when the whole response was
// read, Cancelled after cancel(), DeadlineExceeded, Unavailable for connection failures. When
// the call fails before the head, on_done is the only callback besides on_sending.
// on_sending runs once the connection is up, just before the request goes out: a call that
// ends without it sent nothing (resolving or connecting failed, e.g. the connection was
// refused), so the server cannot have seen the request.
struct StreamCallbacks {
  std::function<void()> on_sending;
  std::function<void(int status, const HeaderList& headers)> on_head;
  std::function<void(std::string_view bytes)> on_body;
  std::function<void(const Status& outcome)> on_done;
};

// A call in flight.
class ClientCall {
 public:
  virtual ~ClientCall() = default;
  // Closes the connection; on_done reports Cancelled (unless it already ran). Thread-safe.
  virtual void cancel() = 0;
};

class HttpClient {
 public:
  // InvalidArgument unless threads >= 1.
  static Result<std::unique_ptr<HttpClient>> create(int threads);
  // Cancels the calls in flight and joins the I/O threads (their on_done runs first).
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  std::shared_ptr<ClientCall> stream(const BaseUrl& url, ClientRequest request,
                                     StreamCallbacks callbacks);
  // The whole response (any status); errors as in StreamCallbacks::on_done.
  void fetch(const BaseUrl& url, ClientRequest request,
             std::function<void(Result<ClientResponse>)> done);
  // fetch() that waits for the answer (never past the request's timeout plus a second).
  Result<ClientResponse> fetch_and_wait(const BaseUrl& url, ClientRequest request);

  struct Impl;

 private:
  explicit HttpClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdserve::http
