#include "common/http/connection.h"

#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/rfc7230.hpp>

#include "common/core/log.h"
#include "common/http/api_error_response.h"

namespace pdserve::http::detail {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using boost::system::error_code;

namespace {

constexpr size_t kReadChunkBytes = 4096;
// Bytes of a pipelined next request kept while an exchange runs; beyond that the connection
// stops watching the socket until the exchange ends.
constexpr size_t kMaxBufferedWhileBusy = size_t{64} << 10;
// After a response with "Connection: close", how long and how much the server drains so the
// client reads the response before the close (a close with unread data sends a reset).
constexpr std::chrono::milliseconds kLingerTimeout{1'000};
constexpr size_t kMaxLingerBytes = size_t{256} << 10;

// The ResponseChannel handed to a handler: posts everything to the connection's strand.
class ChannelImpl final : public ResponseChannel {
 public:
  ChannelImpl(std::weak_ptr<Connection> connection, std::shared_ptr<Exchange> exchange,
              std::shared_ptr<ServerState> state)
      : connection_(std::move(connection)),
        exchange_(std::move(exchange)),
        state_(std::move(state)) {}

  ~ChannelImpl() override {
    if (finished_.exchange(true)) return;
    if (stream_started_) {
      post_to_connection([](Connection& c, const std::shared_ptr<Exchange>& ex) {
        c.abort_exchange(ex, "the handler dropped its stream before ending it");
      });
    } else {
      HttpResponse response =
          api_error_response(internal_server_error("the request handler produced no response"));
      post_to_connection([response = std::move(response)](Connection& c, const std::shared_ptr<Exchange>& ex) {
        c.answer(ex, response);
      });
    }
  }

  void send(HttpResponse response) override {
    if (stream_started_ || finished_.exchange(true)) return;
    post_to_connection([response = std::move(response)](Connection& c, const std::shared_ptr<Exchange>& ex) {
      c.answer(ex, response);
    });
  }

  void start_stream(int status, std::string content_type, HeaderList headers) override {
    if (finished_ || stream_started_.exchange(true)) return;
    post_to_connection([status, content_type = std::move(content_type), headers = std::move(headers)](
             Connection& c, const std::shared_ptr<Exchange>& ex) {
      c.start_stream(ex, status, content_type, headers);
    });
  }

  bool write(std::string data) override {
    if (!stream_started_ || finished_ || cancelled()) return false;
    if (data.empty()) return true;
    const size_t queued = exchange_->queued_bytes.fetch_add(data.size()) + data.size();
    if (queued > state_->options.max_stream_queue_bytes) {
      finished_ = true;
      post_to_connection([](Connection& c, const std::shared_ptr<Exchange>& ex) {
        c.abort_exchange(ex, "the client reads too slowly: its stream queue is full");
      });
      return false;
    }
    return post_to_connection([data = std::move(data)](Connection& c, const std::shared_ptr<Exchange>& ex) {
      c.write_chunk(ex, data);
    });
  }

  void end_stream() override {
    if (!stream_started_ || finished_.exchange(true)) return;
    post_to_connection([](Connection& c, const std::shared_ptr<Exchange>& ex) { c.end_stream(ex); });
  }

  void on_cancel(std::function<void()> fn) override {
    {
      std::lock_guard lock(exchange_->mutex);
      if (!exchange_->cancelled) {
        exchange_->cancel_fn = std::move(fn);
        return;
      }
    }
    fn();
  }

  bool cancelled() const override {
    std::lock_guard lock(exchange_->mutex);
    return exchange_->cancelled;
  }

  void post(std::function<void()> fn) override {
    auto task = std::make_shared<std::function<void()>>(std::move(fn));
    if (!post_to_connection([task](Connection&, const std::shared_ptr<Exchange>&) { (*task)(); })) {
      (*task)();
    }
  }

 private:
  // Runs fn(connection, exchange) on the strand; false when the server or the connection is
  // gone.
  template <typename Fn>
  bool post_to_connection(Fn fn) {
    std::shared_ptr<Connection> connection;  // released outside the lock (its destructor locks)
    std::lock_guard lock(state_->mutex);
    if (!state_->accepting_posts) return false;
    connection = connection_.lock();
    if (!connection) return false;
    asio::post(connection->executor(),
               [connection, exchange = exchange_, fn = std::move(fn)]() mutable {
                 fn(*connection, exchange);
               });
    return true;
  }

  std::weak_ptr<Connection> connection_;
  std::shared_ptr<Exchange> exchange_;
  std::shared_ptr<ServerState> state_;
  std::atomic<bool> stream_started_{false};
  std::atomic<bool> finished_{false};  // send, end_stream or an overflow happened
};

bool is_http_parse_error(const error_code& ec) {
  return &ec.category() == &bhttp::make_error_code(bhttp::error::bad_target).category();
}

// RFC 9112 6.1 and 6.3 for a request's Transfer-Encoding; nullopt when the framing is one
// this server reads: no Transfer-Encoding, or `chunked` alone on HTTP/1.1. Beast reads the body
// as chunked only when chunked is the last coding and reads none at all otherwise (the body
// would then be parsed as the next request: request smuggling). It already refuses
// Transfer-Encoding with Content-Length when chunked is last. Every refusal closes the
// connection, whose framing is now unknown.
std::optional<ApiError> transfer_encoding_problem(
    const bhttp::request_parser<bhttp::string_body>& parser) {
  const auto& message = parser.get();
  const auto [first, last] = message.equal_range(bhttp::field::transfer_encoding);
  if (first == last) return std::nullopt;
  if (message.version() < 11) {
    return invalid_request("Malformed HTTP request: Transfer-Encoding in an HTTP/1.0 request.");
  }
  if (!parser.chunked()) {
    return invalid_request("Malformed HTTP request: the last transfer coding must be chunked.");
  }
  std::string codings;  // every field's codings, in order; chunked is the last one
  for (auto field = first; field != last; ++field) {
    for (const auto coding : bhttp::token_list(field->value())) {
      codings += (codings.empty() ? "" : ", ") + std::string(coding);
    }
  }
  if (beast::iequals(codings, "chunked")) return std::nullopt;
  // RFC 9112 6.1: 501 for a transfer coding the server does not understand.
  ApiError unsupported = invalid_request(
      "Transfer codings other than chunked are not supported (Transfer-Encoding: " + codings +
      ").");
  unsupported.http_status = 501;
  return unsupported;
}

// RFC 9112 5.2: a header line continued on the next (a line break followed by a space or tab)
// is obsolete line folding, which a server may refuse. Beast would join the lines into one
// value, where a proxy in front may have read two (a Transfer-Encoding one side does not see:
// request smuggling), so it is refused.
bool has_obs_fold(std::string_view section) {
  for (size_t at = section.find("\r\n"); at != std::string_view::npos;
       at = section.find("\r\n", at + 2)) {
    if (at + 2 < section.size() && (section[at + 2] == ' ' || section[at + 2] == '\t')) {
      return true;
    }
  }
  return false;
}

std::string header_text(bhttp::field field, beast::string_view custom) {
  if (field == bhttp::field::unknown) return std::string(custom);
  return std::string(bhttp::to_string(field));
}

}  // namespace

Connection::Connection(asio::ip::tcp::socket socket, std::shared_ptr<ServerState> state)
    : socket_(std::move(socket)),
      state_(std::move(state)),
      read_timer_(socket_.get_executor()),
      write_timer_(socket_.get_executor()) {}

Connection::~Connection() {
  std::lock_guard lock(state_->mutex);
  state_->connections.erase(this);
}

void Connection::start() {
  {
    std::lock_guard lock(state_->mutex);
    if (!state_->accepting_posts) {
      asio::post(executor(), [self = shared_from_this()] { self->close_now(); });
      return;
    }
    state_->connections.emplace(this, weak_from_this());
  }
  asio::post(executor(), [self = shared_from_this()] { self->read_next(); });
}

void Connection::close() {
  asio::post(executor(), [self = shared_from_this()] { self->close_now(); });
}

// ---- Reading ----------------------------------------------------------------------------

void Connection::read_next() {
  phase_ = State::kIdle;
  if (buffer_.size() > 0) {
    read_header();
    return;
  }
  arm(read_timer_, state_->options.idle_timeout);
  if (!reading_) read_some();
}

void Connection::read_some() {
  reading_ = true;
  socket_.async_read_some(buffer_.prepare(kReadChunkBytes),
                          [self = shared_from_this()](const error_code& ec, size_t bytes) {
                            self->on_read_some(ec, bytes);
                          });
}

void Connection::on_read_some(const error_code& ec, size_t bytes) {
  reading_ = false;
  if (!ec) buffer_.commit(bytes);
  switch (phase_) {
    case State::kClosed:
      return;
    case State::kClosing:
      discarded_bytes_ += buffer_.size();
      buffer_.consume(buffer_.size());
      if (ec || discarded_bytes_ > kMaxLingerBytes) {
        close_now();
      } else {
        read_some();
      }
      return;
    case State::kIdle:
      if (ec == asio::error::operation_aborted) {
        read_next();  // cancelled so that a pipelined request in the buffer is parsed
      } else if (ec) {
        close_now();
      } else {
        disarm(read_timer_);
        read_header();
      }
      return;
    case State::kExchange:
      if (ec) {
        on_peer_gone(ec == asio::error::eof);
      } else if (buffer_.size() < kMaxBufferedWhileBusy) {
        read_some();
      }
      return;
    case State::kReadingHeader:
      if (ec) {
        close_now();  // the client left before its header was whole: nobody to answer
      } else {
        parse_header_bytes();
      }
      return;
    case State::kReadingBody:
      PDS_CHECK(false, "read_some completed while the request parser owns the socket");
  }
}

void Connection::read_header() {
  phase_ = State::kReadingHeader;
  parser_.emplace();
  parser_->header_limit(static_cast<uint32_t>(state_->options.max_header_bytes));
  parser_->body_limit(state_->options.max_body_bytes);
  arm(read_timer_, state_->options.header_timeout);
  parse_header_bytes();
}

// Feeds the buffered bytes to Beast's parser, as async_read_header would, but sees what it
// takes: a whole line at a time (a field with its continuation lines and their CRLF), so a
// fold is inside the bytes taken and is refused before anything reads the fields.
void Connection::parse_header_bytes() {
  error_code ec;
  const size_t taken = parser_->put(buffer_.data(), ec);
  if (has_obs_fold({static_cast<const char*>(buffer_.data().data()), taken})) {
    disarm(read_timer_);
    reject(400, invalid_request("Malformed HTTP request: a header line is continued on the next "
                                "line (obsolete line folding, RFC 9112 section 5.2).")
                    .body());
    return;
  }
  buffer_.consume(taken);
  if (ec == bhttp::error::need_more) {
    read_some();
  } else {
    on_header(ec);
  }
}

void Connection::on_header(const error_code& ec) {
  disarm(read_timer_);
  if (ec) {
    on_request_error(ec);
    return;
  }
  if (const std::optional<ApiError> problem = transfer_encoding_problem(*parser_)) {
    reject(problem->http_status, problem->body());
    return;
  }
  const auto expect = parser_->get()[bhttp::field::expect];
  if (beast::iequals(expect, "100-continue") && !parser_->is_done()) {
    enqueue({"HTTP/1.1 100 Continue\r\n\r\n", false, 0});
  }
  if (parser_->is_done()) {
    dispatch();
    return;
  }
  phase_ = State::kReadingBody;
  arm(read_timer_, state_->options.body_timeout);
  bhttp::async_read(
      socket_, buffer_, *parser_,
      [self = shared_from_this()](const error_code& read_ec, size_t) { self->on_body(read_ec); });
}

void Connection::on_body(const error_code& ec) {
  disarm(read_timer_);
  if (phase_ == State::kClosed) return;
  if (ec) {
    on_request_error(ec);
    return;
  }
  dispatch();
}

void Connection::on_request_error(const error_code& ec) {
  if (ec == bhttp::error::body_limit) {
    reject(413, payload_too_large(state_->options.max_body_bytes).body());
  } else if (ec == bhttp::error::header_limit) {
    ApiError error = invalid_request("The request headers are larger than the limit of " +
                                     std::to_string(state_->options.max_header_bytes) + " bytes.");
    reject(431, error.body());
  } else if (ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
             !is_http_parse_error(ec)) {
    close_now();  // the client left (or a socket error): nobody to answer
  } else {
    reject(400, invalid_request("Malformed HTTP request: " + ec.message()).body());
  }
}

// ---- Exchanges --------------------------------------------------------------------------

void Connection::dispatch() {
  bhttp::request<bhttp::string_body> message = parser_->release();
  parser_.reset();
  keep_alive_ = message.keep_alive();
  phase_ = State::kExchange;
  exchange_ = std::make_shared<Exchange>();
  if (message.version() < 11) exchange_->framing = StreamFraming::kUntilClose;

  HttpRequest request;
  request.method = std::string(message.method_string());
  request.target = std::string(message.target());
  request.path = request.target.substr(0, request.target.find('?'));
  for (const auto& field : message) {
    request.headers.emplace_back(header_text(field.name(), field.name_string()),
                                 std::string(field.value()));
  }
  request.body = std::move(message.body());

  auto channel = std::make_shared<ChannelImpl>(weak_from_this(), exchange_, state_);
  const RouteMatch route = state_->routes.match(request.method, request.path);
  if (route.handler == nullptr) {
    if (route.allowed.empty()) {
      channel->send(api_error_response(route_not_found(request.method, request.path)));
    } else {
      HttpResponse response = api_error_response(method_not_allowed(request.method, request.path));
      std::string allow;
      for (const std::string& method : route.allowed) {
        allow += allow.empty() ? method : ", " + method;
      }
      response.headers.emplace_back("Allow", allow);
      channel->send(std::move(response));
    }
  } else {
    try {
      (*route.handler)(request, channel);
    } catch (const std::exception& e) {
      PDS_LOG_ERROR("handler for " + request.method + " " + request.path + " threw: " + e.what());
      channel->send(api_error_response(internal_server_error(e.what())));
    } catch (...) {
      PDS_LOG_ERROR("handler for " + request.method + " " + request.path + " threw");
      channel->send(api_error_response(internal_server_error("unknown error")));
    }
  }
  channel.reset();
  // Watch the socket while the exchange runs: EOF or an error means the client left.
  if (!reading_) read_some();
}

void Connection::reject(int status, const std::string& body, const HeaderList& headers) {
  phase_ = State::kExchange;
  keep_alive_ = false;
  HttpResponse response;
  response.status = status;
  response.body = body;
  response.headers = headers;
  enqueue({serialize_response(response, false), true, 0});
}

void Connection::answer(const std::shared_ptr<Exchange>& exchange, const HttpResponse& response) {
  if (exchange != exchange_ || exchange->ended || exchange->answered) return;
  exchange->answered = true;
  enqueue({serialize_response(response, keep_alive_ && !peer_half_closed_), true, 0});
}

void Connection::start_stream(const std::shared_ptr<Exchange>& exchange, int status,
                              const std::string& content_type, const HeaderList& headers) {
  if (exchange != exchange_ || exchange->ended || exchange->answered) return;
  exchange->answered = true;
  exchange->streaming = true;
  // Without chunking, closing the connection is what ends the body.
  if (exchange->framing == StreamFraming::kUntilClose) keep_alive_ = false;
  enqueue({serialize_stream_head(status, content_type, headers, keep_alive_, exchange->framing),
           false, 0});
}

void Connection::write_chunk(const std::shared_ptr<Exchange>& exchange, const std::string& data) {
  if (exchange != exchange_ || exchange->ended || !exchange->streaming) return;
  const bool chunked = exchange->framing == StreamFraming::kChunked;
  enqueue({chunked ? serialize_chunk(data) : data, false, data.size()});
}

void Connection::end_stream(const std::shared_ptr<Exchange>& exchange) {
  if (exchange != exchange_ || exchange->ended || !exchange->streaming) return;
  const bool chunked = exchange->framing == StreamFraming::kChunked;
  enqueue({chunked ? std::string(last_chunk()) : std::string(), true, 0});
}

void Connection::abort_exchange(const std::shared_ptr<Exchange>& exchange, const char* why) {
  if (exchange != exchange_ || exchange->ended) return;
  PDS_LOG_WARN(std::string("closing a connection: ") + why);
  close_now();
}

// ---- Writing ----------------------------------------------------------------------------

void Connection::enqueue(Outgoing outgoing) {
  if (phase_ == State::kClosed) return;
  outgoing_.push_back(std::move(outgoing));
  if (!writing_) write_next();
}

void Connection::write_next() {
  if (outgoing_.empty() || phase_ == State::kClosed) return;
  writing_ = true;
  arm(write_timer_, state_->options.write_timeout);
  asio::async_write(
      socket_, asio::buffer(outgoing_.front().data),
      [self = shared_from_this()](const error_code& ec, size_t) { self->on_write(ec); });
}

void Connection::on_write(const error_code& ec) {
  writing_ = false;
  disarm(write_timer_);
  if (phase_ == State::kClosed) return;
  if (ec) {
    on_peer_gone(false);
    return;
  }
  Outgoing done = std::move(outgoing_.front());
  outgoing_.pop_front();
  if (exchange_ && done.stream_bytes > 0) exchange_->queued_bytes -= done.stream_bytes;
  if (done.ends_response) {
    on_response_done();
  } else {
    write_next();
  }
}

void Connection::on_response_done() {
  if (exchange_) exchange_->ended = true;
  exchange_.reset();
  if (!keep_alive_ || peer_half_closed_) {
    graceful_close();
    return;
  }
  phase_ = State::kIdle;
  if (reading_ && buffer_.size() > 0) {
    // The watch read holds a pipelined request: stop it so the request is parsed now.
    error_code ignored;
    socket_.cancel(ignored);
  } else if (reading_) {
    arm(read_timer_, state_->options.idle_timeout);
  } else {
    read_next();
  }
}

// ---- Closing ----------------------------------------------------------------------------

void Connection::on_peer_gone(bool eof) {
  if (eof && exchange_ && exchange_->answered && !exchange_->streaming) {
    peer_half_closed_ = true;  // deliver the response being written, then close
    return;
  }
  close_now();
}

void Connection::cancel_exchange() {
  if (!exchange_ || exchange_->ended) return;
  exchange_->ended = true;
  std::function<void()> fn;
  {
    std::lock_guard lock(exchange_->mutex);
    exchange_->cancelled = true;
    fn = std::move(exchange_->cancel_fn);
  }
  exchange_.reset();
  if (!fn) return;
  try {
    fn();
  } catch (const std::exception& e) {
    PDS_LOG_ERROR(std::string("a cancel callback threw: ") + e.what());
  }
}

void Connection::graceful_close() {
  phase_ = State::kClosing;
  error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
  buffer_.consume(buffer_.size());
  arm(read_timer_, std::min(kLingerTimeout, state_->options.idle_timeout));
  if (!reading_) read_some();
}

void Connection::close_now() {
  if (phase_ == State::kClosed) return;
  phase_ = State::kClosed;
  cancel_exchange();
  error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  disarm(read_timer_);
  disarm(write_timer_);
  outgoing_.clear();
}

// A timer whose expiry closes the connection. Disarming moves the expiry to the far future,
// which also makes a completion already queued before the disarm a no-op.
void Connection::arm(asio::steady_timer& timer, std::chrono::milliseconds timeout) {
  timer.expires_after(timeout);
  timer.async_wait([self = shared_from_this(), &timer](const error_code& ec) {
    if (ec == asio::error::operation_aborted) return;
    if (timer.expiry() > asio::steady_timer::clock_type::now()) return;
    self->close_now();
  });
}

void Connection::disarm(asio::steady_timer& timer) {
  timer.expires_at(asio::steady_timer::time_point::max());
}

}  // namespace pdserve::http::detail
