// The HTTP server against raw sockets: routing, limits, deadlines, misbehaving clients,
// streaming and cancellation.
#include "common/http/http_server.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/http/test_client.h"

namespace pdserve::http {
namespace {

using namespace std::chrono_literals;
using testing::Clock;
using testing::make_request;
using testing::TestClient;

// Counts events (cancellations, requests that reached a handler, ...) and lets a test wait for
// them.
class EventLog {
 public:
  void record() {
    std::lock_guard lock(mutex_);
    ++count_;
    cv_.notify_all();
  }
  bool wait_for(int count, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return count_ >= count; });
  }
  int count() {
    std::lock_guard lock(mutex_);
    return count_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int count_ = 0;
};

class HttpServerTest : public ::testing::Test {
 protected:
  ~HttpServerTest() override {
    if (server_) server_->stop();
    stop_workers_ = true;
    for (std::thread& thread : workers_) thread.join();
  }

  void start(ServerOptions options = {}) {
    RouteTable router;
    router.add("GET", "/hello", [](const HttpRequest&, std::shared_ptr<ResponseChannel> ch) {
      ch->send({200, "text/plain", {}, "hello"});
    });
    router.add("POST", "/echo",
               [](const HttpRequest& request, std::shared_ptr<ResponseChannel> ch) {
                 ch->send({200, "text/plain", {}, request.body});
               });
    router.add("GET", "/throw", [](const HttpRequest&, std::shared_ptr<ResponseChannel>) {
      throw std::runtime_error("boom");
    });
    router.add("GET", "/drop", [](const HttpRequest&, std::shared_ptr<ResponseChannel>) {});
    // Answers from another thread after 300 ms unless cancelled first.
    router.add("GET", "/later", [this](const HttpRequest&, std::shared_ptr<ResponseChannel> ch) {
      ch->on_cancel([this] { cancels_.record(); });
      later_requests_.record();
      spawn([ch] {
        std::this_thread::sleep_for(300ms);
        ch->send({200, "text/plain", {}, "later"});
      });
    });
    // /stream?chunks=N&bytes=B: N chunks of B bytes from another thread, then the end.
    router.add(
        "GET", "/stream", [this](const HttpRequest& request, std::shared_ptr<ResponseChannel> ch) {
          const size_t chunks = query_number(request.target, "chunks");
          const size_t bytes = query_number(request.target, "bytes");
          const auto pause = std::chrono::milliseconds(query_number(request.target, "pause_ms"));
          ch->on_cancel([this] { cancels_.record(); });
          ch->start_stream(200, "text/event-stream", {});
          spawn([this, ch, chunks, bytes, pause] {
            for (size_t i = 0; i < chunks && !stop_workers_; ++i) {
              if (!ch->write(chunk_payload(i, bytes))) {
                refused_writes_.record();
                return;
              }
              if (pause.count() > 0) std::this_thread::sleep_for(pause);
            }
            ch->end_stream();
            streams_queued_.record();
          });
        });
    auto server = HttpServer::start(options, std::move(router));
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(server).value();
    ASSERT_NE(server_->port(), 0);
  }

  static size_t query_number(const std::string& target, const std::string& key) {
    const size_t at = target.find(key + "=");
    return at == std::string::npos ? 0 : std::stoul(target.substr(at + key.size() + 1));
  }

  // Chunk i: its index then filler, so order and content are both checked.
  static std::string chunk_payload(size_t i, size_t bytes) {
    std::string chunk = std::to_string(i) + ":";
    chunk.resize(std::max(bytes, chunk.size()), static_cast<char>('a' + i % 26));
    return chunk;
  }

  void spawn(std::function<void()> fn) {
    std::lock_guard lock(workers_mutex_);
    workers_.emplace_back(std::move(fn));
  }

  uint16_t port() const { return server_->port(); }

  std::unique_ptr<HttpServer> server_;
  EventLog cancels_;
  EventLog later_requests_;  // /later requests whose handler ran (their cancel is registered)
  EventLog streams_queued_;  // /stream responses whose every chunk and end were queued
  EventLog refused_writes_;  // /stream writes the server refused
  std::atomic<bool> stop_workers_{false};
  std::mutex workers_mutex_;
  std::vector<std::thread> workers_;
};

nlohmann::json json_body(const testing::HttpResponseMessage& response) {
  return nlohmann::json::parse(response.body());
}

TEST_F(HttpServerTest, RoutesKnownPathsAnd404And405) {
  start();
  TestClient client(port());
  ASSERT_TRUE(client.send(make_request("GET", "/hello?x=1")));
  auto hello = client.read_response();
  ASSERT_TRUE(hello);
  EXPECT_EQ(hello->result_int(), 200);
  EXPECT_EQ(hello->body(), "hello");

  ASSERT_TRUE(client.send(make_request("GET", "/nope")));
  auto missing = client.read_response();
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->result_int(), 404);
  EXPECT_EQ(json_body(*missing)["error"]["code"], "not_found");

  ASSERT_TRUE(client.send(make_request("POST", "/hello", "{}")));
  auto wrong_method = client.read_response();
  ASSERT_TRUE(wrong_method);
  EXPECT_EQ(wrong_method->result_int(), 405);
  EXPECT_EQ((*wrong_method)["Allow"], "GET");
  EXPECT_EQ(json_body(*wrong_method)["error"]["code"], "method_not_allowed");
}

TEST_F(HttpServerTest, KeepAliveServesSequentialAndPipelinedRequests) {
  start();
  TestClient client(port());
  for (int i = 0; i < 3; ++i) {
    const std::string body = "body-" + std::to_string(i);
    ASSERT_TRUE(client.send(make_request("POST", "/echo", body)));
    auto response = client.read_response();
    ASSERT_TRUE(response) << i;
    EXPECT_EQ(response->body(), body);
    EXPECT_TRUE(response->keep_alive());
  }
  // Two requests in one write: both answered, in order.
  ASSERT_TRUE(client.send(make_request("POST", "/echo", "first") +
                          make_request("POST", "/echo", "second")));
  auto first = client.read_response();
  auto second = client.read_response();
  ASSERT_TRUE(first && second);
  EXPECT_EQ(first->body(), "first");
  EXPECT_EQ(second->body(), "second");
}

TEST_F(HttpServerTest, ConnectionCloseIsHonoured) {
  start();
  TestClient client(port());
  ASSERT_TRUE(client.send(make_request("GET", "/hello", "", "Connection: close\r\n")));
  auto response = client.read_response();
  ASSERT_TRUE(response);
  EXPECT_FALSE(response->keep_alive());
  EXPECT_TRUE(client.read_until_closed(2000ms));
}

TEST_F(HttpServerTest, BodyOverTheLimitIs413WithoutReadingTheRest) {
  ServerOptions options;
  options.max_body_bytes = 1024;
  options.body_timeout = 10'000ms;
  start(options);
  TestClient client(port());
  // Announces 100 MB but sends 10 bytes: the answer cannot wait for the body.
  const auto begin = Clock::now();
  ASSERT_TRUE(
      client.send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100000000\r\n\r\n0123456789"));
  auto response = client.read_response(3000ms);
  ASSERT_TRUE(response);
  EXPECT_LT(Clock::now() - begin, 2000ms);
  EXPECT_EQ(response->result_int(), 413);
  EXPECT_EQ(json_body(*response)["error"]["code"], "request_too_large");
  EXPECT_TRUE(client.read_until_closed(3000ms));

  // A chunked body crossing the limit is cut off the same way.
  TestClient chunked(port());
  std::string request = "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
  request += "800\r\n" + std::string(2048, 'x') + "\r\n";
  ASSERT_TRUE(chunked.send(request));
  auto chunked_response = chunked.read_response(3000ms);
  ASSERT_TRUE(chunked_response);
  EXPECT_EQ(chunked_response->result_int(), 413);

  // A body at the limit is fine.
  TestClient exact(port());
  ASSERT_TRUE(exact.send(make_request("POST", "/echo", std::string(1024, 'y'))));
  auto ok = exact.read_response();
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->result_int(), 200);
  EXPECT_EQ(ok->body().size(), 1024u);
}

TEST_F(HttpServerTest, MalformedRequestIs400AndClose) {
  start();
  TestClient client(port());
  ASSERT_TRUE(client.send("GET /hello HTTP/1.1\r\nHost t\r\nBroken header line\r\n\r\n"));
  auto response = client.read_response();
  ASSERT_TRUE(response);
  EXPECT_EQ(response->result_int(), 400);
  EXPECT_EQ(json_body(*response)["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(client.read_until_closed(2000ms));
}

// RFC 9112 6.1 and 6.3: the body of a request whose last transfer coding is not chunked has no
// known length; reading it as the next request on the connection would let a client smuggle
// one past a front end that frames it differently.
TEST_F(HttpServerTest, TransferEncodingNotEndingInChunkedIs400AndClose) {
  start();
  const std::string smuggled = make_request("GET", "/hello");
  for (const std::string codings :
       {"gzip", "chunked, gzip", "identity", "", "gzip\r\nContent-Length: 5"}) {
    TestClient client(port());
    ASSERT_TRUE(client.send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: " + codings +
                            "\r\n\r\n" + smuggled));
    auto response = client.read_response();
    ASSERT_TRUE(response) << codings;
    EXPECT_EQ(response->result_int(), 400) << codings;
    EXPECT_EQ(json_body(*response)["error"]["type"], "invalid_request_error") << codings;
    EXPECT_FALSE(response->keep_alive()) << codings;
    auto rest = client.read_until_closed(2000ms);
    ASSERT_TRUE(rest) << codings << ": the connection must close";
    EXPECT_EQ(*rest, "") << codings << ": the smuggled request was answered";
  }
}

TEST_F(HttpServerTest, UnsupportedCodingsContentLengthConflictsAndHttp10ChunkedAreRefused) {
  start();
  const std::string chunked_body = "5\r\nhello\r\n0\r\n\r\n";
  const std::vector<std::pair<std::string, int>> cases = {
      // Chunked last, but a coding this server does not decode before it.
      {"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501},
      {"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: "
       "chunked\r\n\r\n",
       501},
      // Both framings, in either order (Beast refuses these itself).
      {"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nTransfer-Encoding: "
       "chunked\r\n\r\n",
       400},
      {"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nContent-Length: "
       "5\r\n\r\n",
       400},
      // HTTP/1.0 has no transfer codings: its framing is faulty.
      {"POST /echo HTTP/1.0\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
  };
  for (const auto& [head, status] : cases) {
    TestClient client(port());
    ASSERT_TRUE(client.send(head + chunked_body));
    auto response = client.read_response();
    ASSERT_TRUE(response) << head;
    EXPECT_EQ(response->result_int(), status) << head;
    EXPECT_TRUE(client.read_until_closed(2000ms)) << head << ": the connection must close";
  }
  // Chunked alone is read as before.
  TestClient client(port());
  ASSERT_TRUE(client.send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" +
                          chunked_body));
  auto response = client.read_response();
  ASSERT_TRUE(response);
  EXPECT_EQ(response->result_int(), 200);
  EXPECT_EQ(response->body(), "hello");
}

// RFC 9112 5.2: a header line continued on the next (obs-fold) is refused, not joined into one
// value: a front end that reads the lines apart would frame the body differently (smuggling).
TEST_F(HttpServerTest, ObsFoldIs400AndClose) {
  start();
  const std::string chunked_body = "5\r\nhello\r\n0\r\n\r\n";
  const std::string smuggled = make_request("GET", "/hello");
  const std::vector<std::vector<std::string>> requests = {
      // Transfer-Encoding's value on a continuation line (Beast would read "chunked").
      {"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding:\r\n chunked\r\n\r\n"},
      {"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip,\r\n\tchunked\r\n\r\n"},
      // A Transfer-Encoding line that a fold hides inside another header.
      {"POST /echo HTTP/1.1\r\nHost: t\r\nX-Note: a\r\n Transfer-Encoding: chunked\r\n\r\n"},
      // Any other header, and a fold split across two reads.
      {"GET /hello HTTP/1.1\r\nHost: t\r\nX-Note: a\r\n b\r\n\r\n"},
      {"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding:\r\n", " chunked\r\n\r\n"},
  };
  for (const std::vector<std::string>& parts : requests) {
    const std::string& name = parts.front();
    TestClient client(port());
    for (size_t i = 0; i < parts.size(); ++i) {
      const bool last = i + 1 == parts.size();
      ASSERT_TRUE(client.send(last ? parts[i] + chunked_body + smuggled : parts[i])) << name;
    }
    auto response = client.read_response();
    ASSERT_TRUE(response) << name;
    EXPECT_EQ(response->result_int(), 400) << name;
    EXPECT_NE(json_body(*response)["error"]["message"].get<std::string>().find("folding"),
              std::string::npos)
        << name;
    EXPECT_FALSE(response->keep_alive()) << name;
    auto rest = client.read_until_closed(2000ms);
    ASSERT_TRUE(rest) << name << ": the connection must close";
    EXPECT_EQ(*rest, "") << name << ": the smuggled request was answered";
  }
  // Whitespace inside a value, and a pipelined pair, are no fold.
  TestClient client(port());
  ASSERT_TRUE(client.send(make_request("GET", "/hello", "", "X-Note: a \t b\r\n") +
                          make_request("GET", "/hello")));
  for (int i = 0; i < 2; ++i) {
    auto response = client.read_response();
    ASSERT_TRUE(response) << i;
    EXPECT_EQ(response->result_int(), 200) << i;
  }
}

TEST_F(HttpServerTest, GarbageBytesAreRejectedAndTheServerKeepsServing) {
  start();
  std::string garbage;
  uint32_t state = 12345;
  for (int i = 0; i < 4096; ++i) {
    state = state * 1664525u + 1013904223u;
    garbage.push_back(static_cast<char>(state >> 24));
  }
  for (int round = 0; round < 5; ++round) {
    TestClient client(port());
    client.send(garbage.substr(round * 100));
    auto bytes = client.read_until_closed(3000ms);
    ASSERT_TRUE(bytes) << "the server must close a connection that sends garbage";
    if (!bytes->empty()) {
      EXPECT_EQ(bytes->rfind("HTTP/1.1 400", 0), 0u) << *bytes;
    }
  }
  TestClient client(port());
  ASSERT_TRUE(client.send(make_request("GET", "/hello")));
  auto response = client.read_response();
  ASSERT_TRUE(response);
  EXPECT_EQ(response->result_int(), 200);
}

TEST_F(HttpServerTest, SlowlorisHeadersAreDroppedAtTheHeaderDeadline) {
  ServerOptions options;
  options.header_timeout = 400ms;
  start(options);
  TestClient client(port());
  const std::string request = make_request("GET", "/hello", "", "X-Slow: aaaaaaaaaaaaaaaaaaaa\r\n");
  const auto begin = Clock::now();
  bool closed = false;
  for (char c : request) {  // one byte every 50 ms: the whole header would take seconds
    if (!client.send(std::string(1, c))) {
      closed = true;
      break;
    }
    auto bytes = client.read_until_closed(50ms);
    if (bytes) {
      closed = true;
      break;
    }
  }
  const auto elapsed = Clock::now() - begin;
  EXPECT_TRUE(closed);
  EXPECT_GE(elapsed, 350ms);
  EXPECT_LT(elapsed, 1500ms);
}

TEST_F(HttpServerTest, SlowBodyIsDroppedAtTheBodyDeadline) {
  ServerOptions options;
  options.body_timeout = 400ms;
  start(options);
  TestClient client(port());
  ASSERT_TRUE(client.send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nabc"));
  const auto begin = Clock::now();
  EXPECT_TRUE(client.read_until_closed(3000ms));
  EXPECT_LT(Clock::now() - begin, 1500ms);
}

TEST_F(HttpServerTest, IdleKeepAliveConnectionIsClosed) {
  ServerOptions options;
  options.idle_timeout = 300ms;
  start(options);
  TestClient client(port());
  ASSERT_TRUE(client.send(make_request("GET", "/hello")));
  ASSERT_TRUE(client.read_response());
  const auto begin = Clock::now();
  EXPECT_TRUE(client.read_until_closed(3000ms));
  EXPECT_GE(Clock::now() - begin, 250ms);
  // A connection that never sends anything is closed too.
  TestClient silent(port());
  EXPECT_TRUE(silent.read_until_closed(3000ms));
}

TEST_F(HttpServerTest, HalfClosedClientGetsItsResponse) {
  start();
  TestClient client(port());
  ASSERT_TRUE(client.send(make_request("POST", "/echo", "half")));
  client.shutdown_send();
  auto response = client.read_response();
  ASSERT_TRUE(response);
  EXPECT_EQ(response->body(), "half");
  EXPECT_TRUE(client.read_until_closed(2000ms));
}

TEST_F(HttpServerTest, ClientLeavingBeforeALateAnswerCancels) {
  start();
  TestClient client(port());
  ASSERT_TRUE(client.send(make_request("GET", "/later")));
  ASSERT_TRUE(later_requests_.wait_for(1, 2000ms));  // the request is the handler's
  client.close();
  EXPECT_TRUE(cancels_.wait_for(1, 2000ms));
  // A client that stays gets the late answer and no cancellation.
  TestClient patient(port());
  ASSERT_TRUE(patient.send(make_request("GET", "/later")));
  auto response = patient.read_response();
  ASSERT_TRUE(response);
  EXPECT_EQ(response->body(), "later");
  EXPECT_EQ(cancels_.count(), 1);
}

TEST_F(HttpServerTest, HandlerExceptionIs500AndTheConnectionLives) {
  start();
  TestClient client(port());
  ASSERT_TRUE(client.send(make_request("GET", "/throw")));
  auto response = client.read_response();
  ASSERT_TRUE(response);
  EXPECT_EQ(response->result_int(), 500);
  EXPECT_EQ(json_body(*response)["error"]["type"], "server_error");
  ASSERT_TRUE(client.send(make_request("GET", "/drop")));
  auto dropped = client.read_response();
  ASSERT_TRUE(dropped);
  EXPECT_EQ(dropped->result_int(), 500);
  ASSERT_TRUE(client.send(make_request("GET", "/hello")));
  auto hello = client.read_response();
  ASSERT_TRUE(hello);
  EXPECT_EQ(hello->result_int(), 200);
}

TEST_F(HttpServerTest, StreamReachesASlowReaderIntactAndInOrder) {
  start();
  TestClient client(port());
  ASSERT_TRUE(client.send(make_request("GET", "/stream?chunks=300&bytes=2000")));
  ASSERT_TRUE(client.read_response_header());
  // The whole stream waits in the queue and socket buffers before the client reads on.
  ASSERT_TRUE(streams_queued_.wait_for(1, 5000ms));
  auto response = client.read_response(10'000ms);
  ASSERT_TRUE(response);
  EXPECT_EQ(response->result_int(), 200);
  EXPECT_EQ((*response)["Content-Type"], "text/event-stream");
  std::string expected;
  for (size_t i = 0; i < 300; ++i) expected += chunk_payload(i, 2000);
  EXPECT_EQ(response->body(), expected);
  EXPECT_EQ(cancels_.count(), 0);
  // The connection goes on after the stream.
  ASSERT_TRUE(client.send(make_request("GET", "/hello")));
  auto hello = client.read_response();
  ASSERT_TRUE(hello);
  EXPECT_EQ(hello->body(), "hello");
}

// HTTP/1.0 has no chunked coding: the stream's bytes go out as they are and the server closes
// the connection to end it (RFC 9112 6.3: the body then ends at the close).
TEST_F(HttpServerTest, Http10ClientGetsAnUnchunkedStreamEndedByTheClose) {
  start();
  for (const std::string connection : {"", "Connection: keep-alive\r\n"}) {
    TestClient client(port());
    ASSERT_TRUE(
        client.send("GET /stream?chunks=3&bytes=10 HTTP/1.0\r\nHost: t\r\n" + connection + "\r\n"));
    auto bytes = client.read_until_closed(5000ms);
    ASSERT_TRUE(bytes) << connection << ": the server must close to end the stream";
    const size_t head_end = bytes->find("\r\n\r\n");
    ASSERT_NE(head_end, std::string::npos) << *bytes;
    const std::string head = bytes->substr(0, head_end + 2);
    EXPECT_EQ(head.find("Transfer-Encoding"), std::string::npos) << head;
    EXPECT_EQ(head.find("Content-Length"), std::string::npos) << head;
    EXPECT_NE(head.find("Connection: close\r\n"), std::string::npos) << head;
    EXPECT_EQ(bytes->substr(head_end + 4),
              chunk_payload(0, 10) + chunk_payload(1, 10) + chunk_payload(2, 10));
  }
  EXPECT_EQ(cancels_.count(), 0);
}

TEST_F(HttpServerTest, DisconnectDuringAStreamCancels) {
  start();
  TestClient client(port());
  ASSERT_TRUE(client.send(make_request("GET", "/stream?chunks=100000&bytes=10&pause_ms=5")));
  ASSERT_TRUE(client.read_response_header());
  EXPECT_FALSE(client.read_some(100, 1000ms).empty());
  client.close();
  EXPECT_TRUE(cancels_.wait_for(1, 2000ms));
}

TEST_F(HttpServerTest, StreamQueueOverflowClosesAndCancels) {
  ServerOptions options;
  options.max_stream_queue_bytes = 256 << 10;
  start(options);
  TestClient client(port());
  // 200 MB that the client never reads: the bounded queue must refuse, not grow.
  ASSERT_TRUE(client.send(make_request("GET", "/stream?chunks=20000&bytes=10000")));
  EXPECT_TRUE(cancels_.wait_for(1, 5000ms));
  EXPECT_TRUE(refused_writes_.wait_for(1, 2000ms));
  EXPECT_EQ(streams_queued_.count(), 0) << "the whole stream was queued";
}

TEST_F(HttpServerTest, StopClosesOpenStreamsAndCancelsThem) {
  ServerOptions options;
  options.shutdown_timeout = 2000ms;
  start(options);
  TestClient client(port());
  ASSERT_TRUE(client.send(make_request("GET", "/stream?chunks=100000&bytes=10&pause_ms=5")));
  ASSERT_TRUE(client.read_response_header());
  TestClient idle(port());
  const auto begin = Clock::now();
  server_->stop();
  EXPECT_LT(Clock::now() - begin, 2500ms);
  EXPECT_EQ(cancels_.count(), 1);
  EXPECT_TRUE(client.read_until_closed(2000ms));
  EXPECT_TRUE(idle.read_until_closed(2000ms));
}

TEST(HttpServerStartTest, ReportsTheEphemeralPortAndRefusesABusyOne) {
  auto first = HttpServer::start({}, RouteTable{});
  ASSERT_TRUE(first.ok());
  ServerOptions busy;
  busy.port = first.value()->port();
  // SO_REUSEADDR does not allow two listeners on one port.
  auto second = HttpServer::start(busy, RouteTable{});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  ServerOptions bad_host;
  bad_host.host = "no such host name.invalid";
  auto third = HttpServer::start(bad_host, RouteTable{});
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::http
