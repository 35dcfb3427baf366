// A small HTTP/1.1 server on Boost.Asio/Beast: N I/O threads, one strand per connection,
// keep-alive, deadlines on every phase (a slowloris client is dropped), a body limit (413
// before the body is read), 400 and close for malformed requests (and for framing RFC 9112
// refuses: a Transfer-Encoding that does not end in chunked, or comes with Content-Length or in
// an HTTP/1.0 request; 501 and close for codings other than chunked), handlers that may answer
// later from any thread, streaming with a bounded queue per connection (chunked, or for an
// HTTP/1.0 client unchunked and ended by closing the connection), and
// cancellation when the client goes away mid-exchange.
//
// Disconnects: while a handler has not answered yet, or while a stream runs, the server keeps
// reading the socket; EOF or an error there means the client left, so the exchange is
// cancelled. A plain response already being written is still delivered to a client that
// half-closed its side, and the connection is closed after it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/core/status.h"
#include "common/http/route_table.h"

namespace pdserve::http {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: an ephemeral port, see HttpServer::port()
  int threads = 2;
  size_t max_body_bytes = size_t{16} << 20;
  size_t max_header_bytes = size_t{16} << 10;
  // From the first byte of a request to the end of its headers (slowloris).
  std::chrono::milliseconds header_timeout{10'000};
  // For the whole body, after the headers.
  std::chrono::milliseconds body_timeout{30'000};
  // Waiting for the next request on a keep-alive connection.
  std::chrono::milliseconds idle_timeout{60'000};
  // For each write to the socket to complete.
  std::chrono::milliseconds write_timeout{30'000};
  // Bytes of a stream queued for one connection but not yet written.
  size_t max_stream_queue_bytes = size_t{8} << 20;
  // How long stop() waits for connections to wind down before stopping the I/O threads.
  std::chrono::milliseconds shutdown_timeout{5'000};
};

class HttpServer {
 public:
  // Binds, listens and starts the I/O threads. InvalidArgument for a bad host or option,
  // Unavailable when the address cannot be bound.
  static Result<std::unique_ptr<HttpServer>> start(const ServerOptions& options, RouteTable routes);

  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The bound port (the ephemeral one when options.port was 0).
  uint16_t port() const;
  // Stops accepting, closes every connection (cancelling their exchanges) and joins the I/O
  // threads within options.shutdown_timeout. Idempotent.
  void stop();

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdserve::http
