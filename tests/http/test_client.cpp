#include "tests/http/test_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/read.hpp>

namespace pdserve::testing {
namespace asio = boost::asio;
namespace bhttp = boost::beast::http;
using boost::system::error_code;

TestClient::TestClient(uint16_t port) : socket_(io_) {
  socket_.connect({asio::ip::make_address("127.0.0.1"), port});
}

bool TestClient::send(std::string_view bytes) {
  error_code ec;
  asio::write(socket_, asio::buffer(bytes.data(), bytes.size()), ec);
  return !ec;
}

void TestClient::shutdown_send() {
  error_code ignored;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
}

void TestClient::close() {
  error_code ignored;
  socket_.close(ignored);
}

bool TestClient::run_until(const bool& done, std::chrono::milliseconds timeout) {
  io_.restart();
  const auto deadline = Clock::now() + timeout;
  while (!done && Clock::now() < deadline) {
    io_.run_one_for(deadline - Clock::now());
  }
  if (!done) {
    error_code ignored;
    socket_.cancel(ignored);
    io_.restart();
    io_.run();  // lets the cancelled operation complete
  }
  return done;
}

std::optional<HttpResponseMessage> TestClient::read_response(std::chrono::milliseconds timeout) {
  bool done = false;
  error_code result;
  if (header_parser_) {
    header_parser_->body_limit(boost::none);
    bhttp::async_read(socket_, buffer_, *header_parser_, [&](const error_code& ec, size_t) {
      result = ec;
      done = true;
    });
    if (!run_until(done, timeout) || result) return std::nullopt;
    HttpResponseMessage message = header_parser_->release();
    header_parser_.reset();
    return message;
  }
  bhttp::response_parser<bhttp::string_body> parser;
  parser.body_limit(boost::none);
  bhttp::async_read(socket_, buffer_, parser, [&](const error_code& ec, size_t) {
    result = ec;
    done = true;
  });
  if (!run_until(done, timeout) || result) return std::nullopt;
  return parser.release();
}

bool TestClient::read_response_header(std::chrono::milliseconds timeout) {
  header_parser_.emplace();
  bool done = false;
  error_code result;
  bhttp::async_read_header(socket_, buffer_, *header_parser_, [&](const error_code& ec, size_t) {
    result = ec;
    done = true;
  });
  return run_until(done, timeout) && !result;
}

std::optional<std::string> TestClient::read_until_closed(std::chrono::milliseconds timeout) {
  std::string bytes(static_cast<const char*>(buffer_.data().data()), buffer_.size());
  buffer_.consume(buffer_.size());
  bool closed = false;
  const auto deadline = Clock::now() + timeout;
  while (!closed && Clock::now() < deadline) {
    char chunk[4096];
    bool done = false;
    socket_.async_read_some(asio::buffer(chunk), [&](const error_code& ec, size_t n) {
      bytes.append(chunk, n);
      if (ec && ec != asio::error::operation_aborted) closed = true;
      done = true;
    });
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (!run_until(done, std::max(left, std::chrono::milliseconds(1)))) break;
  }
  if (!closed) return std::nullopt;
  return bytes;
}

std::string TestClient::read_some(size_t max_bytes, std::chrono::milliseconds timeout) {
  if (buffer_.size() > 0) {
    const size_t n = std::min(max_bytes, buffer_.size());
    std::string bytes(static_cast<const char*>(buffer_.data().data()), n);
    buffer_.consume(n);
    return bytes;
  }
  std::string bytes(max_bytes, '\0');
  size_t got = 0;
  bool done = false;
  socket_.async_read_some(asio::buffer(bytes), [&](const error_code&, size_t n) {
    got = n;
    done = true;
  });
  run_until(done, timeout);
  bytes.resize(got);
  return bytes;
}

std::string make_request(std::string_view method, std::string_view target, std::string_view body,
                         std::string_view extra_headers) {
  std::string request =
      std::string(method) + " " + std::string(target) + " HTTP/1.1\r\nHost: t\r\n";
  request += extra_headers;
  if (!body.empty() || method == "POST") {
    request +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  request += "\r\n";
  request += body;
  return request;
}

}  // namespace pdserve::testing
