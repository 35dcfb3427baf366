// One accepted HTTP/1.1 connection of HttpServer (internal to common/http). Every member runs
// on the connection's strand; ResponseChannel implementations reach it only by posting there.
#pragma once

#include <atomic>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "common/http/http_server.h"

namespace pdserve::http::detail {

class Connection;

// What the server, its connections and the channels given to handlers share.
struct ServerState {
  ServerState(ServerOptions options_in, RouteTable routes_in)
      : options(std::move(options_in)), routes(std::move(routes_in)) {}

  const ServerOptions options;
  const RouteTable routes;

  std::mutex mutex;
  bool accepting_posts = true;  // false once stop() began: channels post nothing more
  std::unordered_map<const Connection*, std::weak_ptr<Connection>> connections;
};

// One request/response exchange on a connection.
struct Exchange {
  std::mutex mutex;
  bool cancelled = false;           // guarded by mutex
  std::function<void()> cancel_fn;  // guarded by mutex
  std::atomic<size_t> queued_bytes{0};
  // Strand only:
  bool answered = false;                            // a response or a stream head was queued
  bool streaming = false;                           // a stream was started
  StreamFraming framing = StreamFraming::kChunked;  // kUntilClose for an HTTP/1.0 client
  bool ended = false;                               // fully written or cancelled
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(boost::asio::ip::tcp::socket socket, std::shared_ptr<ServerState> state);
  ~Connection();

  void start();
  // From any thread: closes the connection, cancelling its exchange.
  void close();

  // Posted by the exchange's channel; stale exchanges are ignored.
  void answer(const std::shared_ptr<Exchange>& exchange, const HttpResponse& response);
  void start_stream(const std::shared_ptr<Exchange>& exchange, int status,
                    const std::string& content_type, const HeaderList& headers);
  void write_chunk(const std::shared_ptr<Exchange>& exchange, const std::string& data);
  void end_stream(const std::shared_ptr<Exchange>& exchange);
  // The handler dropped its channel mid-stream, or the stream queue overflowed.
  void abort_exchange(const std::shared_ptr<Exchange>& exchange, const char* why);

  boost::asio::any_io_executor executor() { return socket_.get_executor(); }

 private:
  // kReadingHeader: read_some feeds the header to Beast's parser; kReadingBody: Beast's
  // parser owns the socket.
  enum class State { kIdle, kReadingHeader, kReadingBody, kExchange, kClosing, kClosed };

  struct Outgoing {
    std::string data;
    bool ends_response = false;
    size_t stream_bytes = 0;  // payload bytes counted in the exchange's queue
  };

  void read_next();
  void read_some();
  void on_read_some(const boost::system::error_code& ec, size_t bytes);
  void read_header();
  void parse_header_bytes();
  void on_header(const boost::system::error_code& ec);
  void on_body(const boost::system::error_code& ec);
  void on_request_error(const boost::system::error_code& ec);
  void dispatch();
  void reject(int status, const std::string& body, const HeaderList& headers = {});

  void enqueue(Outgoing outgoing);
  void write_next();
  void on_write(const boost::system::error_code& ec);
  void on_response_done();

  void on_peer_gone(bool eof);
  void cancel_exchange();
  void graceful_close();
  void close_now();

  void arm(boost::asio::steady_timer& timer, std::chrono::milliseconds timeout);
  static void disarm(boost::asio::steady_timer& timer);

  boost::asio::ip::tcp::socket socket_;
  std::shared_ptr<ServerState> state_;
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  boost::asio::steady_timer read_timer_;
  boost::asio::steady_timer write_timer_;
  State phase_ = State::kIdle;
  bool reading_ = false;
  bool writing_ = false;
  bool keep_alive_ = true;
  bool peer_half_closed_ = false;
  size_t discarded_bytes_ = 0;
  std::deque<Outgoing> outgoing_;
  std::shared_ptr<Exchange> exchange_;
};

}  // namespace pdserve::http::detail
