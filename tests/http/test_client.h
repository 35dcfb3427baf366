// A raw-socket HTTP client for tests: writes exact bytes, reads responses with deadlines, and
// can trickle, half-close or vanish, as misbehaving clients do.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

namespace pdserve::testing {

using Clock = std::chrono::steady_clock;
using HttpResponseMessage = boost::beast::http::response<boost::beast::http::string_body>;

class TestClient {
 public:
  explicit TestClient(uint16_t port);

  // Writes every byte (blocking); false when the server has closed the connection.
  bool send(std::string_view bytes);
  // Shuts down the write side (half-close).
  void shutdown_send();
  // Closes the socket at once.
  void close();

  // Reads one whole response (chunked bodies decoded); nullopt on timeout, EOF or error.
  std::optional<HttpResponseMessage> read_response(
      std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));
  // Reads only the status line and headers of a response.
  bool read_response_header(std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));
  // Reads raw bytes until the server closes the connection; nullopt when it is still open
  // after `timeout`.
  std::optional<std::string> read_until_closed(std::chrono::milliseconds timeout);
  // Up to `max_bytes` raw bytes (after what the response parser buffered); "" on EOF/timeout.
  std::string read_some(size_t max_bytes, std::chrono::milliseconds timeout);

 private:
  // Runs the io_context until `done` or the deadline; cancels the socket on the deadline.
  bool run_until(const bool& done, std::chrono::milliseconds timeout);

  boost::asio::io_context io_;
  boost::asio::ip::tcp::socket socket_;
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::response_parser<boost::beast::http::string_body>>
      header_parser_;
};

// "GET /path HTTP/1.1\r\nHost: t\r\n\r\n" style requests.
std::string make_request(std::string_view method, std::string_view target,
                         std::string_view body = "", std::string_view extra_headers = "");

}  // namespace pdserve::testing
