// A scripted HTTP server for the pdserve-bench-serving tests: whatever a test's callback writes
// on each connection (a stream that dies mid-way, a stall, an error status, ...).
#pragma once

#include <atomic>
#include <functional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/buffers_iterator.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/streambuf.hpp>

#include "bench/serving/serving_benchmark.h"

namespace pdserve::bench {

// A server on a free port that answers each connection with `respond` on its own thread,
// given the request's body (read to its Content-Length).
class FakeServer {
 public:
  using tcp = boost::asio::ip::tcp;

  explicit FakeServer(std::function<void(tcp::socket&)> respond)
      : FakeServer([respond = std::move(respond)](tcp::socket& socket, const std::string&) {
          respond(socket);
        }) {}
  explicit FakeServer(std::function<void(tcp::socket&, const std::string&)> respond)
      : acceptor_(io_, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0)),
        thread_([this, respond = std::move(respond)] {
          boost::system::error_code ec;
          for (;;) {
            tcp::socket socket(io_);
            acceptor_.accept(socket, ec);
            if (ec || stopping_) return;
            boost::asio::streambuf request;
            const size_t header_end = boost::asio::read_until(socket, request, "\r\n\r\n", ec);
            respond(socket, read_body(socket, request, header_end));
            sockets_.push_back(std::move(socket));  // stalled answers keep theirs open
          }
        }) {}
  ~FakeServer() {
    stopping_ = true;
    boost::system::error_code ec;
    tcp::socket poke(io_);
    poke.connect(acceptor_.local_endpoint(), ec);
    thread_.join();
  }
  Endpoint endpoint() const {
    return {"127.0.0.1", std::to_string(acceptor_.local_endpoint().port())};
  }

 private:
  // The body after the headers (the first `header_end` bytes of `buffer`), by Content-Length.
  static std::string read_body(tcp::socket& socket, boost::asio::streambuf& buffer,
                               size_t header_end) {
    const std::string received(boost::asio::buffers_begin(buffer.data()),
                               boost::asio::buffers_end(buffer.data()));
    std::smatch length;
    const std::string headers = received.substr(0, header_end);
    if (!std::regex_search(headers, length,
                           std::regex("Content-Length: *([0-9]+)", std::regex::icase))) {
      return {};
    }
    const size_t size = std::stoul(length[1]);
    std::string body = received.substr(header_end);
    boost::system::error_code ec;
    if (body.size() < size) {
      std::string rest(size - body.size(), '\0');
      boost::asio::read(socket, boost::asio::buffer(rest), ec);
      body += rest;
    }
    return body;
  }

  boost::asio::io_context io_;
  tcp::acceptor acceptor_;
  std::vector<tcp::socket> sockets_;
  std::atomic<bool> stopping_ = false;
  std::thread thread_;
};

}  // namespace pdserve::bench
