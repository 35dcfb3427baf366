// The cluster's HTTP client against the server: whole and streamed responses, errors, the
// deadline, cancellation, and many calls at once.
#include "common/http/http_client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <tuple>
#include <thread>
#include <utility>
#include <tuple>

#include "common/http/http_server.h"
#include "tests/http/scripted_server.h"

namespace pdserve::http {
namespace {

using namespace std::chrono_literals;

class HttpClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RouteTable router;
    router.add(
        "POST", "/echo", [](const HttpRequest& request, std::shared_ptr<ResponseChannel> ch) {
          std::string auth(request.header("Authorization").value_or(""));
          std::string host(request.header("Host").value_or(""));
          ch->send({201, "application/json", {{"X-Auth", auth}, {"X-Host", host}}, request.body});
        });
    router.add("GET", "/stream", [](const HttpRequest&, std::shared_ptr<ResponseChannel> ch) {
      ch->start_stream(200, "text/event-stream", {});
      std::thread([ch] {
        for (int i = 0; i < 5; ++i) {
          ch->write("data: " + std::to_string(i) + "\n\n");
          std::this_thread::sleep_for(5ms);
        }
        ch->end_stream();
      }).detach();
    });
    router.add("GET", "/silent", [this](const HttpRequest&, std::shared_ptr<ResponseChannel> ch) {
      park(std::move(ch));  // never answers
    });
    router.add("GET", "/stall", [this](const HttpRequest&, std::shared_ptr<ResponseChannel> ch) {
      ch->start_stream(200, "text/event-stream", {});
      ch->write("data: 0\n\n");
      park(std::move(ch));  // then freezes mid-stream
    });
    ServerOptions options;
    options.port = 0;
    auto server = HttpServer::start(options, std::move(router));
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(*server);
    url_ = {"127.0.0.1", std::to_string(server_->port())};
    auto client = HttpClient::create(2);
    ASSERT_TRUE(client.ok());
    client_ = std::move(*client);
  }
  void TearDown() override {
    client_.reset();
    {
      std::lock_guard lock(parked_mutex_);
      parked_.reset();
    }
    if (server_) server_->stop();
  }

  // A handler keeps its exchange open (it never answers, or stops mid-stream).
  void park(std::shared_ptr<ResponseChannel> ch) {
    std::lock_guard lock(parked_mutex_);
    parked_ = std::move(ch);
    ++parked_count_;
    parked_changed_.notify_all();
  }
  // Until `count` requests have reached a parking handler: they are in flight, unanswered.
  bool wait_for_parked(int count) {
    std::unique_lock lock(parked_mutex_);
    return parked_changed_.wait_for(lock, 5s, [&] { return parked_count_ >= count; });
  }

  std::unique_ptr<HttpServer> server_;
  std::unique_ptr<HttpClient> client_;
  std::mutex parked_mutex_;
  std::condition_variable parked_changed_;
  std::shared_ptr<ResponseChannel> parked_;
  int parked_count_ = 0;
  BaseUrl url_;
};

TEST_F(HttpClientTest, FetchesAWholeResponseWithHeaders) {
  for (int i = 0; i < 50; ++i) {
    ClientRequest request;
    request.method = "POST";
    request.target = "/echo";
    request.body = R"({"n":)" + std::to_string(i) + "}";
    request.headers.emplace_back("Authorization", "Bearer t");
    Result<ClientResponse> response = client_->fetch_and_wait(url_, request);
    ASSERT_TRUE(response.ok()) << response.status().to_string();
    EXPECT_EQ(response->status, 201);
    EXPECT_EQ(response->body, request.body);
    EXPECT_EQ(response->header("x-auth").value_or(""), "Bearer t");
    // A non-default port is part of Host (RFC 9110), so a server can name itself from it.
    EXPECT_EQ(response->header("x-host").value_or(""), "127.0.0.1:" + url_.port);
  }
}

// A peer cannot make fetch() hold an unbounded body: over the bound the call fails and the
// body is not kept; at the bound it is whole.
TEST_F(HttpClientTest, FetchRefusesABodyOverItsBound) {
  ClientRequest request;
  request.method = "POST";
  request.target = "/echo";
  request.body = std::string(1000, 'x');
  request.max_fetch_body_bytes = 1000;
  Result<ClientResponse> whole = client_->fetch_and_wait(url_, request);
  ASSERT_TRUE(whole.ok()) << whole.status().to_string();
  EXPECT_EQ(whole->body, request.body);
  request.max_fetch_body_bytes = 999;
  Result<ClientResponse> over = client_->fetch_and_wait(url_, request);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted) << over.status().to_string();
}

TEST_F(HttpClientTest, StreamsChunksAsTheyArrive) {
  std::promise<Status> done;
  std::string body;
  int pieces = 0;
  StreamCallbacks callbacks;
  callbacks.on_head = [](int status, const HeaderList&) { EXPECT_EQ(status, 200); };
  callbacks.on_body = [&](std::string_view bytes) {
    body.append(bytes);
    ++pieces;
  };
  callbacks.on_done = [&](const Status& outcome) { done.set_value(outcome); };
  ClientRequest request;
  request.target = "/stream";
  client_->stream(url_, request, callbacks);
  auto future = done.get_future();
  ASSERT_EQ(future.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(future.get().ok());
  EXPECT_EQ(body, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n");
  EXPECT_GE(pieces, 2);  // not all buffered into one piece
}

TEST_F(HttpClientTest, ReportsTheDeadlineAndCancellation) {
  ClientRequest request;
  request.target = "/silent";
  request.timeout = 200ms;
  const auto start = std::chrono::steady_clock::now();
  Result<ClientResponse> response = client_->fetch_and_wait(url_, request);
  EXPECT_EQ(response.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);

  std::promise<Status> done;
  StreamCallbacks callbacks;
  callbacks.on_done = [&](const Status& outcome) { done.set_value(outcome); };
  request.timeout = 30s;
  auto call = client_->stream(url_, request, callbacks);
  ASSERT_TRUE(wait_for_parked(2)) << "the streamed call never reached the server";
  call->cancel();
  auto future = done.get_future();
  ASSERT_EQ(future.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(future.get().code(), StatusCode::kCancelled);
}

// A server that accepts and never answers, or goes silent mid-stream, fails the call at the
// phase deadline, long before the call's own; a stream that keeps talking is not cut.
TEST_F(HttpClientTest, HeadAndIdleDeadlinesEndSilentCallsEarly) {
  const auto call = [&](const std::string& target) {
    ClientRequest request;
    request.target = target;
    request.timeout = 30s;
    request.head_timeout = 300ms;
    request.idle_timeout = 300ms;
    std::promise<Status> done;
    std::string body;
    StreamCallbacks callbacks;
    callbacks.on_body = [&](std::string_view bytes) { body.append(bytes); };
    callbacks.on_done = [&](const Status& outcome) { done.set_value(outcome); };
    const auto start = std::chrono::steady_clock::now();
    client_->stream(url_, request, callbacks);
    auto future = done.get_future();
    EXPECT_EQ(future.wait_for(5s), std::future_status::ready) << target;
    const Status outcome = future.get();
    return std::make_tuple(outcome, std::chrono::steady_clock::now() - start, body);
  };
  const auto [silent, silent_after, silent_body] = call("/silent");
  EXPECT_EQ(silent.code(), StatusCode::kDeadlineExceeded) << silent.to_string();
  EXPECT_NE(silent.message().find("no response head in time (300 ms)"), std::string::npos)
      << silent.message();
  EXPECT_GE(silent_after, 290ms);
  EXPECT_LT(silent_after, 3s);

  const auto [stalled, stalled_after, stalled_body] = call("/stall");
  EXPECT_EQ(stalled.code(), StatusCode::kDeadlineExceeded) << stalled.to_string();
  EXPECT_NE(stalled.message().find("the response went silent (300 ms)"), std::string::npos)
      << stalled.message();
  EXPECT_EQ(stalled_body, "data: 0\n\n");
  EXPECT_LT(stalled_after, 3s);

  const auto [talking, talking_after, talking_body] = call("/stream");
  EXPECT_TRUE(talking.ok()) << talking.to_string();
  EXPECT_EQ(talking_body, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n");
}

TEST_F(HttpClientTest, ConnectionRefusedIsUnavailable) {
  server_->stop();
  ClientRequest request;
  request.target = "/echo";
  Result<ClientResponse> response = client_->fetch_and_wait(url_, request);
  EXPECT_EQ(response.status().code(), StatusCode::kUnavailable);
}

// on_sending tells a call that may have reached the server from one that cannot have (the
// decode node frees a request's KV blocks at once only in the second case).
TEST_F(HttpClientTest, OnSendingRunsOnlyWhenTheRequestStartsToGoOut) {
  auto call_once = [&](const std::string& target) {
    auto sending = std::make_shared<std::atomic<int>>(0);
    auto head_seen_sending = std::make_shared<std::atomic<bool>>(false);
    std::promise<Status> done;
    StreamCallbacks callbacks;
    callbacks.on_sending = [sending] { ++*sending; };
    callbacks.on_head = [sending, head_seen_sending](int, const HeaderList&) {
      *head_seen_sending = *sending == 1;
    };
    callbacks.on_done = [&](const Status& outcome) { done.set_value(outcome); };
    ClientRequest request;
    request.method = "POST";
    request.target = target;
    request.body = "x";
    request.timeout = 5s;
    client_->stream(url_, request, callbacks);
    auto future = done.get_future();
    EXPECT_EQ(future.wait_for(10s), std::future_status::ready);
    return std::make_tuple(future.get(), sending->load(), head_seen_sending->load());
  };
  const auto [answered, sent, before_head] = call_once("/echo");
  EXPECT_TRUE(answered.ok()) << answered.to_string();
  EXPECT_EQ(sent, 1);
  EXPECT_TRUE(before_head);
  server_->stop();
  const auto refused = call_once("/echo");
  EXPECT_EQ(std::get<0>(refused).code(), StatusCode::kUnavailable);
  EXPECT_EQ(std::get<1>(refused), 0);
}

// RFC 9110 15.2: a client must take interim answers before the final one. They were the final
// answer before (issue #34 item 4): the call ended with status 100 and no body.
TEST(HttpClientInterimTest, InterimAnswersAreReadAndDropped) {
  testing::ScriptedServer server(
      "HTTP/1.1 100 Continue\r\n\r\n"
      "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
      "HTTP/1.1 102 Processing\r\n\r\n"
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Final: yes\r\n"
      "Content-Length: 11\r\n\r\n{\"ok\":true}");
  auto client = std::move(HttpClient::create(1).value());
  ClientRequest request;
  request.method = "POST";
  request.body = "{}";
  request.timeout = 5s;
  Result<ClientResponse> response =
      client->fetch_and_wait({"127.0.0.1", std::to_string(server.port())}, request);
  ASSERT_TRUE(response.ok()) << response.status().to_string();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, R"({"ok":true})");
  EXPECT_EQ(response->header("X-Final").value_or(""), "yes");
  EXPECT_FALSE(response->header("Link").has_value());  // the interim answer's header
}

// Interim answers do not restart the head deadline: a node that sends 100 Continue and then
// nothing fails the call when the head deadline runs out.
TEST(HttpClientInterimTest, InterimAnswersDoNotExtendTheHeadDeadline) {
  testing::ScriptedServer server("HTTP/1.1 100 Continue\r\n\r\n");
  auto client = std::move(HttpClient::create(1).value());
  ClientRequest request;
  request.timeout = 30s;
  request.head_timeout = 300ms;
  const auto start = std::chrono::steady_clock::now();
  Result<ClientResponse> response =
      client->fetch_and_wait({"127.0.0.1", std::to_string(server.port())}, request);
  EXPECT_EQ(response.status().code(), StatusCode::kDeadlineExceeded)
      << response.status().to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

// No call asks for an upgrade, so 101 is a broken answer, not a final one to relay.
TEST(HttpClientInterimTest, SwitchingProtocolsUnaskedFailsTheCall) {
  testing::ScriptedServer server(
      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n");
  auto client = std::move(HttpClient::create(1).value());
  ClientRequest request;
  request.timeout = 5s;
  Result<ClientResponse> response =
      client->fetch_and_wait({"127.0.0.1", std::to_string(server.port())}, request);
  EXPECT_EQ(response.status().code(), StatusCode::kUnavailable) << response.status().to_string();
  EXPECT_NE(response.status().message().find("HTTP 101"), std::string::npos);
}

// A server that sends only interim answers is cut off after a bounded number of them.
TEST(HttpClientInterimTest, EndlessInterimAnswersFailTheCall) {
  std::string interims;
  for (int i = 0; i < 40; ++i) interims += "HTTP/1.1 100 Continue\r\n\r\n";
  testing::ScriptedServer server(interims);
  auto client = std::move(HttpClient::create(1).value());
  ClientRequest request;
  request.timeout = 5s;
  Result<ClientResponse> response =
      client->fetch_and_wait({"127.0.0.1", std::to_string(server.port())}, request);
  EXPECT_EQ(response.status().code(), StatusCode::kUnavailable) << response.status().to_string();
  EXPECT_NE(response.status().message().find("interim"), std::string::npos);
}

// A body without chunks is handed on as it arrives, not held to its end: a node's unchunked
// stream reaches the proxy's relay piece by piece, and a Content-Length of a terabyte reserves
// nothing (it was reserved whole before the first byte).
TEST(HttpClientBodyTest, AnUnchunkedBodyIsHandedOnAsItArrives) {
  testing::ScriptedServer server(
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 1000000000000\r\n"
      "\r\ndata: 1\n\n");
  auto client = std::move(HttpClient::create(1).value());
  std::promise<std::string> first_piece;
  std::promise<Status> done;
  StreamCallbacks callbacks;
  bool first = true;
  callbacks.on_body = [&](std::string_view bytes) {
    if (std::exchange(first, false)) first_piece.set_value(std::string(bytes));
  };
  callbacks.on_done = [&](const Status& outcome) { done.set_value(outcome); };
  ClientRequest request;
  request.timeout = 30s;
  auto call = client->stream({"127.0.0.1", std::to_string(server.port())}, request, callbacks);
  auto piece = first_piece.get_future();
  ASSERT_EQ(piece.wait_for(5s), std::future_status::ready) << "the body was held back";
  EXPECT_EQ(piece.get(), "data: 1\n\n");
  call->cancel();
  auto outcome = done.get_future();
  ASSERT_EQ(outcome.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(outcome.get().code(), StatusCode::kCancelled);
}

TEST(BaseUrlTest, ParsesAndRejects) {
  auto url = parse_base_url("http://127.0.0.1:8080/");
  ASSERT_TRUE(url.ok());
  EXPECT_EQ(url->host, "127.0.0.1");
  EXPECT_EQ(url->port, "8080");
  EXPECT_EQ(parse_base_url("http://example")->port, "80");
  for (const char* bad : {"https://a:1", "http://a:0", "http://a:99999", "http://a/b", "http://:80",
                          "ftp://x", "http://a b:80", "http://::1:80", "http://[::1",
                          "http://[::1]x", "http://[]:80", "http://[::1]:0"}) {
    EXPECT_FALSE(parse_base_url(bad).ok()) << bad;
  }
}

// A node registers, and the servers print, http:// + host + port: an IPv6 literal needs brackets
// there (and in the Host header), the resolver takes it without them.
TEST(BaseUrlTest, JoinsHostAndPortBracketingIpv6) {
  EXPECT_EQ(join_base_url("10.0.0.5", "8001"), "http://10.0.0.5:8001");
  EXPECT_EQ(join_base_url("decode-0.pdserve.svc", "8001"), "http://decode-0.pdserve.svc:8001");
  EXPECT_EQ(join_base_url("::1", "8001"), "http://[::1]:8001");
  EXPECT_EQ(join_base_url("fe80::1%eth0", "80"), "http://[fe80::1%eth0]:80");
  for (const char* url : {"http://10.0.0.5:8001", "http://decode-0.pdserve.svc:8001",
                          "http://[::1]:8001", "http://[2001:db8::7]:8001"}) {
    auto parsed = parse_base_url(url);
    ASSERT_TRUE(parsed.ok()) << url << ": " << parsed.status().to_string();
    EXPECT_EQ(parsed->to_string(), url);
  }
  auto ipv6 = parse_base_url("http://[::1]/");
  ASSERT_TRUE(ipv6.ok());
  EXPECT_EQ(ipv6->host, "::1");
  EXPECT_EQ(ipv6->port, "80");
}

}  // namespace
}  // namespace pdserve::http
