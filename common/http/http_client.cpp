#include "common/http/http_client.h"

#include <atomic>
#include <future>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

#include "common/core/log.h"

namespace pdserve::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// Interim answers taken before the final one: a server that sends nothing else is broken.
constexpr int kMaxInterimAnswers = 16;
// The most bytes of a body handed to on_body at once.
constexpr size_t kBodyPieceBytes = 64 * 1024;

// One call: its connection (on a strand, so cancel() from any thread is safe) and callbacks.
class Call : public ClientCall, public std::enable_shared_from_this<Call> {
 public:
  Call(asio::io_context& io, BaseUrl url, ClientRequest request, StreamCallbacks callbacks)
      : strand_(asio::make_strand(io)),
        stream_(strand_),
        url_(std::move(url)),
        request_(std::move(request)),
        callbacks_(std::move(callbacks)) {}

  void start() { asio::co_spawn(strand_, run(shared_from_this()), asio::detached); }

  void cancel() override {
    asio::post(strand_, [self = shared_from_this()] {
      self->cancelled_ = true;
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
      self->stream_.close();
    });
  }

 private:
  std::string where() const { return request_.method + " " + url_.to_string() + request_.target; }

  Status failure(const beast::error_code& ec, std::string_view stage) const {
    if (cancelled_) return cancelled(where() + ": cancelled");
    if (ec == beast::error::timeout) {
      return deadline_exceeded(where() + ": " + std::string(stage) + ": " +
                               (phase_limited_ ? phase_limit_ : "deadline exceeded"));
    }
    return unavailable(where() + ": " + std::string(stage) + ": " + ec.message());
  }

  // The next operations end by the call's deadline, or `phase` from now when that is sooner
  // (`what` then says which limit ran out).
  void arm(const std::optional<Clock::duration>& phase, std::string what) {
    const Clock::time_point now = Clock::now();
    phase_limited_ = phase.has_value() && now + *phase < deadline_;
    if (phase_limited_) {
      phase_limit_ = std::move(what) + " (" +
                     std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(*phase)
                                        .count()) +
                     " ms)";
      stream_.expires_at(now + *phase);
    } else {
      stream_.expires_at(deadline_);
    }
  }

  void done(const Status& outcome) {
    if (finished_) return;
    finished_ = true;
    if (callbacks_.on_done) callbacks_.on_done(outcome);
  }

  static asio::awaitable<void> run(std::shared_ptr<Call> self) { co_await self->exchange(); }

  asio::awaitable<void> exchange() {
    beast::error_code ec;
    deadline_ = Clock::now() + request_.timeout;
    stream_.expires_at(deadline_);
    tcp::resolver resolver(strand_);
    auto endpoints = co_await resolver.async_resolve(url_.host, url_.port,
                                                     asio::redirect_error(asio::use_awaitable, ec));
    if (ec || cancelled_) co_return done(failure(ec, "resolve"));
    co_await stream_.async_connect(endpoints, asio::redirect_error(asio::use_awaitable, ec));
    if (ec || cancelled_) co_return done(failure(ec, "connect"));
    if (callbacks_.on_sending) callbacks_.on_sending();

    const auto verb = bhttp::string_to_verb(request_.method);
    bhttp::request<bhttp::string_body> message(verb, request_.target, 11);
    // RFC 9110: the port is part of Host unless it is the scheme's default.
    message.set(bhttp::field::host,
                url_.port == "80" ? url_host(url_.host) : url_host(url_.host) + ":" + url_.port);
    message.keep_alive(false);
    for (const auto& [name, value] : request_.headers) message.set(name, value);
    if (!request_.body.empty() || verb == bhttp::verb::post) {
      message.set(bhttp::field::content_type, request_.content_type);
      message.body() = request_.body;
    }
    message.prepare_payload();
    co_await bhttp::async_write(stream_, message, asio::redirect_error(asio::use_awaitable, ec));
    if (ec || cancelled_) co_return done(failure(ec, "send"));

    // RFC 9110 15.2: interim answers (100 Continue, 103 Early Hints, ...) may come before the
    // final one; each is read and dropped, all within the one head deadline. The body is read
    // into a fixed buffer and handed on piece by piece, whatever its framing: a string body
    // would reserve a whole Content-Length (a node could name a terabyte) and hold an
    // unchunked stream until its end.
    std::optional<bhttp::response_parser<bhttp::buffer_body>> head;
    beast::flat_buffer buffer;
    arm(request_.head_timeout, "no response head in time");
    for (int interim = 0;; ++interim) {
      head.emplace();
      head->body_limit(std::numeric_limits<std::uint64_t>::max());
      co_await bhttp::async_read_header(stream_, buffer, *head,
                                        asio::redirect_error(asio::use_awaitable, ec));
      if (ec || cancelled_) co_return done(failure(ec, "read the response head"));
      const unsigned status = head->get().result_int();
      if (status == 101) {
        // No request of this client asks for an upgrade, so the server broke the protocol.
        co_return done(unavailable(where() + ": the server switched protocols (HTTP 101) " +
                                   "though no upgrade was asked"));
      }
      if (status >= 200) break;
      if (interim == kMaxInterimAnswers) {
        co_return done(unavailable(where() + ": more than " + std::to_string(kMaxInterimAnswers) +
                                   " interim (1xx) answers before the final one"));
      }
    }
    bhttp::response_parser<bhttp::buffer_body>& parser = *head;
    if (callbacks_.on_head) {
      HeaderList headers;
      for (const auto& field : parser.get()) {
        headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
      }
      callbacks_.on_head(static_cast<int>(parser.get().result_int()), headers);
    }
    std::vector<char> piece(kBodyPieceBytes);
    while (!parser.is_done()) {
      parser.get().body().data = piece.data();
      parser.get().body().size = piece.size();
      arm(request_.idle_timeout, "the response went silent");
      co_await bhttp::async_read_some(stream_, buffer, parser,
                                      asio::redirect_error(asio::use_awaitable, ec));
      if (ec == bhttp::error::need_buffer) ec = {};  // the piece is full: hand it on
      if (ec || cancelled_) co_return done(failure(ec, "read the response body"));
      const size_t got = piece.size() - parser.get().body().size;
      if (got > 0 && callbacks_.on_body) callbacks_.on_body(std::string_view(piece.data(), got));
    }
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    done(Status::ok_status());
  }

  asio::strand<asio::io_context::executor_type> strand_;
  beast::tcp_stream stream_;
  BaseUrl url_;
  ClientRequest request_;
  StreamCallbacks callbacks_;
  bool cancelled_ = false;
  Clock::time_point deadline_{};
  bool phase_limited_ = false;  // the armed expiry is a phase limit, not the deadline
  std::string phase_limit_;
  bool finished_ = false;
};

}  // namespace

std::optional<std::string_view> ClientResponse::header(std::string_view name) const {
  return find_header(headers, name);
}

std::string url_host(std::string_view host) {
  if (host.find(':') == std::string_view::npos) return std::string(host);
  return "[" + std::string(host) + "]";
}

std::string join_base_url(std::string_view host, std::string_view port) {
  return "http://" + url_host(host) + ":" + std::string(port);
}

Result<BaseUrl> parse_base_url(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  const std::string quoted = "'" + std::string(url) + "'";
  if (!url.starts_with(kScheme)) {
    return invalid_argument("the URL " + quoted + " must start with http://");
  }
  std::string_view rest = url.substr(kScheme.size());
  while (rest.ends_with('/')) rest.remove_suffix(1);
  if (rest.find('/') != std::string_view::npos) {
    return invalid_argument("the URL " + quoted + " takes no path, only http://HOST[:PORT]");
  }
  BaseUrl base;
  std::string_view after_host;  // ":PORT" or nothing
  if (rest.starts_with('[')) {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) {
      return invalid_argument("the URL " + quoted + " has no ']' after its IPv6 address");
    }
    base.host = std::string(rest.substr(1, close - 1));
    after_host = rest.substr(close + 1);
    if (!after_host.empty() && !after_host.starts_with(':')) {
      return invalid_argument("the URL " + quoted + " has no valid host");
    }
  } else {
    const size_t colon = rest.find(':');
    base.host = std::string(rest.substr(0, colon));
    if (colon != std::string_view::npos) after_host = rest.substr(colon);
  }
  if (!after_host.empty()) {
    const std::string_view port = after_host.substr(1);
    const bool digits = !port.empty() && port.size() <= 5 &&
                        port.find_first_not_of("0123456789") == std::string_view::npos;
    if (!digits || std::stoi(std::string(port)) < 1 || std::stoi(std::string(port)) > 65535) {
      return invalid_argument("the URL " + quoted + " has an invalid port '" + std::string(port) +
                              "' (an IPv6 address goes in brackets: http://[::1]:8000)");
    }
    base.port = std::string(port);
  }
  if (base.host.empty() || base.host.find_first_of(" \t\r\n@[]") != std::string::npos) {
    return invalid_argument("the URL " + quoted + " has no valid host");
  }
  return base;
}

struct HttpClient::Impl {
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::vector<std::thread> threads;
  std::mutex mutex;
  std::vector<std::weak_ptr<Call>> calls;  // for cancellation at shutdown

  void track(const std::shared_ptr<Call>& call) {
    std::lock_guard lock(mutex);
    std::erase_if(calls, [](const std::weak_ptr<Call>& weak) { return weak.expired(); });
    calls.push_back(call);
  }
};

Result<std::unique_ptr<HttpClient>> HttpClient::create(int threads) {
  if (threads < 1) return invalid_argument("http client: threads must be >= 1");
  auto impl = std::make_unique<Impl>();
  for (int i = 0; i < threads; ++i) {
    impl->threads.emplace_back([io = &impl->io] {
      try {
        io->run();
      } catch (const std::exception& e) {
        PDS_LOG_ERROR(std::string("http client: an I/O thread stopped on an exception: ") +
                      e.what());
      }
    });
  }
  return std::unique_ptr<HttpClient>(new HttpClient(std::move(impl)));
}

HttpClient::HttpClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpClient::~HttpClient() {
  std::vector<std::shared_ptr<Call>> live;
  {
    std::lock_guard lock(impl_->mutex);
    for (const auto& weak : impl_->calls) {
      if (auto call = weak.lock()) live.push_back(std::move(call));
    }
  }
  for (const auto& call : live) call->cancel();
  live.clear();
  impl_->work.reset();
  for (std::thread& thread : impl_->threads) thread.join();
}

std::shared_ptr<ClientCall> HttpClient::stream(const BaseUrl& url, ClientRequest request,
                                               StreamCallbacks callbacks) {
  auto call = std::make_shared<Call>(impl_->io, url, std::move(request), std::move(callbacks));
  impl_->track(call);
  call->start();
  return call;
}

void HttpClient::fetch(const BaseUrl& url, ClientRequest request,
                       std::function<void(Result<ClientResponse>)> done) {
  auto response = std::make_shared<ClientResponse>();
  auto over_bound = std::make_shared<bool>(false);  // the callbacks run one at a time
  const size_t max_body = request.max_fetch_body_bytes;
  StreamCallbacks callbacks;
  callbacks.on_head = [response](int status, const HeaderList& headers) {
    response->status = status;
    response->headers = headers;
  };
  callbacks.on_body = [response, over_bound, max_body](std::string_view bytes) {
    if (*over_bound) return;
    if (bytes.size() > max_body - response->body.size()) {
      *over_bound = true;
      response->body.clear();
      response->body.shrink_to_fit();
      return;
    }
    response->body.append(bytes);
  };
  callbacks.on_done = [response, over_bound, max_body, done = std::move(done)](
                          const Status& outcome) {
    if (*over_bound) {
      done(resource_exhausted("http client: the response body is over " +
                              std::to_string(max_body) + " bytes"));
    } else if (outcome.ok()) {
      done(std::move(*response));
    } else {
      done(outcome);
    }
  };
  stream(url, std::move(request), std::move(callbacks));
}

Result<ClientResponse> HttpClient::fetch_and_wait(const BaseUrl& url, ClientRequest request) {
  const auto limit = request.timeout + std::chrono::seconds(1);
  auto promise = std::make_shared<std::promise<Result<ClientResponse>>>();
  std::future<Result<ClientResponse>> future = promise->get_future();
  fetch(url, std::move(request),
        [promise](Result<ClientResponse> result) { promise->set_value(std::move(result)); });
  if (future.wait_for(limit) != std::future_status::ready) {
    return deadline_exceeded("http client: no answer from " + url.to_string());
  }
  return future.get();
}

}  // namespace pdserve::http
