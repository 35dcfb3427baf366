// Through a real ProxyServer (issue #34 items 2 and 4): what the proxy passes on from a client
// with its own cluster token, and how it relays what a decode node answers.
//  * Client fields stay client fields: a body field of kClusterOnlyBodyFields gets a 400 that
//    names it and never reaches a node; a header of kClusterOnlyHeaders never reaches one.
//  * HTTP relay by the RFC: interim 1xx answers are consumed, 101 is a failed node, 204, 205
//    and 304 are a 502; an SSE event over the relay's bound ends the client's stream with an
//    error event.
//  * The cluster token never reaches a client without it in a node's error text.
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/http/http_client.h"
#include "common/http/http_server.h"
#include "common/protocol/cluster_only_fields.h"
#include "proxy/proxy_server.h"
#include "proxy/timeline_relay.h"
#include "tests/http/scripted_server.h"
#include "tests/http/test_client.h"

namespace pdserve::proxy {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;
using testing::HttpResponseMessage;
using testing::make_request;
using testing::ScriptedServer;
using testing::TestClient;

constexpr char kToken[] = "cluster-secret-7f3a";
constexpr char kTokenAuth[] = "Authorization: Bearer cluster-secret-7f3a\r\n";
constexpr char kCompletion[] = R"({"model":"m","prompt":"hi","max_tokens":2})";

// A decode node that records what reaches it and answers each route with a fixed response.
class RecordingNode {
 public:
  explicit RecordingNode(http::HttpResponse answer) : answer_(std::move(answer)) {
    http::RouteTable router;
    for (const char* path : {"/v1/completions", "/tokenize"}) {
      router.add(
          "POST", path,
          [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
            {
              std::lock_guard lock(mutex_);
              seen_.push_back(request);
            }
            ch->send(answer_);
          });
    }
    server_ = std::move(http::HttpServer::start({}, std::move(router)).value());
  }
  ~RecordingNode() { server_->stop(); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  std::vector<http::HttpRequest> seen() {
    std::lock_guard lock(mutex_);
    return seen_;
  }

 private:
  const http::HttpResponse answer_;
  std::mutex mutex_;
  std::vector<http::HttpRequest> seen_;
  std::unique_ptr<http::HttpServer> server_;
};

// A whole 200 answer with Content-Length.
std::string reply_200(const std::string& content_type, const std::string& body) {
  return "HTTP/1.1 200 OK\r\nContent-Type: " + content_type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// The head of a chunked 200 stream, and one chunk of it.
std::string chunked_stream_head() {
  return "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
}
std::string chunk(const std::string& data) {
  char size[32];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  return size + data + "\r\n";
}

class ProxyRelayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    client_ = std::move(http::HttpClient::create(2).value());
    ProxyOptions options;
    options.access.cluster_token = kToken;
    options.first_byte_timeout = 5s;
    options.stream_idle_timeout = 5s;
    proxy_ = std::make_unique<ProxyServer>(registry_, *client_, options);
    http::RouteTable router;
    proxy_->register_routes(router);
    server_ = std::move(http::HttpServer::start({}, std::move(router)).value());
  }
  void TearDown() override {
    server_->stop();
    client_.reset();
  }

  void add_decode(const std::string& url) {
    const Json body = {{"role", "decode"}, {"url", url}, {"model", "m"}, {"kv_blocks_total", 100}};
    ASSERT_TRUE(registry_.register_node(body, std::chrono::steady_clock::now()).ok());
  }

  void remove_nodes() {
    for (const Json& node : registry_.to_json(std::chrono::steady_clock::now())["nodes"]) {
      EXPECT_TRUE(registry_.remove(node["id"].get<std::string>()).ok());
    }
  }

  // One request on a fresh connection; `headers`: extra header lines, each ending in CRLF.
  HttpResponseMessage call(const std::string& method, const std::string& target,
                           const std::string& body, const std::string& headers = "") {
    TestClient client(server_->port());
    EXPECT_TRUE(client.send(make_request(method, target, body, headers)));
    std::optional<HttpResponseMessage> response = client.read_response(10'000ms);
    EXPECT_TRUE(response.has_value()) << method << " " << target << ": no response in 10 s";
    return response ? std::move(*response) : HttpResponseMessage{};
  }

  static Json error_of(const HttpResponseMessage& response) {
    const Json body = Json::parse(response.body(), nullptr, false);
    return body.is_object() ? body.value("error", Json::object()) : Json::object();
  }

  NodeRegistry registry_{RegistryOptions{}};
  std::unique_ptr<http::HttpClient> client_;
  std::unique_ptr<ProxyServer> proxy_;
  std::unique_ptr<http::HttpServer> server_;
};

// Sent straight to a decode node, pdserve_resume needs the token; through the proxy, which adds
// its own, it used to work for anyone. Every client is refused now, token holders too (only
// the proxy resumes streams through the proxy), also with the key spelled with an escape.
TEST_F(ProxyRelayTest, ClusterOnlyBodyFieldsAreRefusedWithA400NamingThem) {
  RecordingNode node({200, "application/json", {}, R"({"choices":[{"text":"ok"}]})"});
  add_decode(node.url());
  for (const std::string_view field : kClusterOnlyBodyFields) {
    const std::string name(field);
    Json body = Json::parse(kCompletion);
    body[name] = {{"id", "cmpl-chosen"}, {"created", 1}, {"choices", Json::array()}};
    // The same key with its first letter written as a \u escape.
    char first_letter[8];
    std::snprintf(first_letter, sizeof(first_letter), "\\u%04x",
                  static_cast<unsigned>(static_cast<unsigned char>(name[0])));
    const std::string escaped =
        R"({"prompt":"hi",")" + std::string(first_letter) + name.substr(1) + R"(":{}})";
    for (const std::string& sent : {body.dump(), escaped}) {
      for (const char* path : {"/v1/completions", "/v1/chat/completions", "/tokenize"}) {
        for (const char* auth : {"", kTokenAuth}) {
          const HttpResponseMessage response = call("POST", path, sent, auth);
          EXPECT_EQ(response.result_int(), 400) << path << " " << sent << ": " << response.body();
          EXPECT_EQ(error_of(response).value("param", ""), name) << response.body();
          EXPECT_EQ(error_of(response).value("type", ""), "invalid_request_error");
        }
      }
    }
  }
  EXPECT_TRUE(node.seen().empty()) << "a refused request reached the node";
  // The same name deeper down is content, not the field: it passes.
  const std::string nested = R"({"prompt":"hi","metadata":{"pdserve_resume":1}})";
  EXPECT_EQ(call("POST", "/v1/completions", nested).result_int(), 200);
  ASSERT_EQ(node.seen().size(), 1u);
  EXPECT_EQ(node.seen()[0].body, nested);
}

// The proxy builds a node's headers itself: a client's value of a cluster-only header never
// reaches the node, on either forwarding path, with or without the token; the node sees the
// proxy's Authorization, not the client's.
TEST_F(ProxyRelayTest, ClusterOnlyHeadersNeverReachANode) {
  RecordingNode node({200, "application/json", {}, R"({"choices":[{"text":"ok"}]})"});
  add_decode(node.url());
  for (const std::string_view header : kClusterOnlyHeaders) {
    const std::string client_value = "http://203.0.113.9:1/client-value";
    for (const char* auth : {"Authorization: Bearer client-key\r\n", kTokenAuth}) {
      for (const char* path : {"/v1/completions", "/tokenize"}) {
        const std::string headers =
            std::string(auth) + std::string(header) + ": " + client_value + "\r\n";
        EXPECT_EQ(call("POST", path, kCompletion, headers).result_int(), 200) << path;
        const http::HttpRequest seen = node.seen().back();
        for (const auto& [name, value] : seen.headers) {
          EXPECT_NE(value, client_value) << header << " reached the node as " << name;
        }
        EXPECT_EQ(seen.header("Authorization").value_or(""), std::string("Bearer ") + kToken);
      }
    }
  }
}

// A node's 100 Continue (or 102, 103) before its answer was relayed as the final answer: the
// client got an empty 100 and waited for a response that never came.
TEST_F(ProxyRelayTest, InterimAnswersFromANodeAreConsumed) {
  const std::string answer = R"({"choices":[{"text":"ok"}]})";
  for (const std::string& interim :
       {std::string("HTTP/1.1 100 Continue\r\n\r\n"),
        std::string("HTTP/1.1 102 Processing\r\n\r\n"),
        std::string("HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n")}) {
    ScriptedServer node(interim + reply_200("application/json", answer));
    remove_nodes();
    add_decode(node.url());
    const HttpResponseMessage response = call("POST", "/v1/completions", kCompletion);
    EXPECT_EQ(response.result_int(), 200) << interim;
    EXPECT_EQ(response.body(), answer) << interim;
  }
}

// A stream after an interim answer streams as usual.
TEST_F(ProxyRelayTest, AStreamAfterAnInterimAnswerIsRelayed) {
  const std::string events = "data: {\"choices\":[{\"text\":\"ok\"}]}\n\ndata: [DONE]\n\n";
  ScriptedServer node("HTTP/1.1 100 Continue\r\n\r\n" + reply_200("text/event-stream", events));
  add_decode(node.url());
  const HttpResponseMessage response =
      call("POST", "/v1/completions", R"({"prompt":"hi","stream":true})");
  EXPECT_EQ(response.result_int(), 200);
  EXPECT_EQ(response.body(), events);
}

// 101 to a request that asked no upgrade is a broken node: the request goes elsewhere, and with
// no other node the client gets a 503 at once.
TEST_F(ProxyRelayTest, SwitchingProtocolsIsAFailedNode) {
  ScriptedServer broken("HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n");
  add_decode(broken.url());
  const auto start = std::chrono::steady_clock::now();
  const HttpResponseMessage alone = call("POST", "/v1/completions", kCompletion);
  EXPECT_EQ(alone.result_int(), 503) << alone.body();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
  RecordingNode healthy({200, "application/json", {}, R"({"choices":[{"text":"ok"}]})"});
  ScriptedServer broken_again("HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n");
  add_decode(broken_again.url());
  add_decode(healthy.url());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(call("POST", "/v1/completions", kCompletion).result_int(), 200) << i;
  }
}

// 204, 205 and 304 have no content by definition: never an answer to an API call, so the client
// gets a 502 with an error body (a 204 was relayed with a body of its own before), on both
// forwarding paths.
TEST_F(ProxyRelayTest, ContentlessAnswersAreABadGateway) {
  for (const auto& [status, reason] : std::vector<std::pair<int, std::string>>{
           {204, "No Content"}, {205, "Reset Content"}, {304, "Not Modified"}}) {
    // A 205 says its content is empty (RFC 9110 15.3.6); 204 and 304 have none by definition.
    ScriptedServer node("HTTP/1.1 " + std::to_string(status) + " " + reason +
                        "\r\nContent-Type: text/event-stream\r\n" +
                        (status == 205 ? "Content-Length: 0\r\n" : "") + "\r\n");
    remove_nodes();
    add_decode(node.url());
    for (const char* path : {"/v1/completions", "/tokenize"}) {
      const HttpResponseMessage response = call("POST", path, R"({"prompt":"hi","stream":true})");
      EXPECT_EQ(response.result_int(), 502) << status << " " << path;
      EXPECT_EQ(error_of(response).value("code", ""), "bad_gateway") << response.body();
      EXPECT_NE(error_of(response).value("message", "").find(std::to_string(status)),
                std::string::npos);
    }
  }
}

// An SSE event without its blank line used to be held whole (a node could grow it without
// bound) and then cut the client's stream with no error event: past the relay's bound the
// client's stream ends with an error event and [DONE], while the node is still sending.
TEST_F(ProxyRelayTest, AnSseEventOverTheBoundEndsTheStreamWithAnErrorEvent) {
  const std::string first = "data: {\"choices\":[{\"text\":\"a\"}]}\n\n";
  // 20 MiB of one event in 1 MiB chunks, and the stream not ended.
  std::string reply = chunked_stream_head() + chunk(first) + chunk("data: ");
  for (int i = 0; i < 20; ++i) reply += chunk(std::string(size_t{1} << 20, 'x'));
  ScriptedServer node(reply);
  add_decode(node.url());
  const HttpResponseMessage response =
      call("POST", "/v1/completions", R"({"prompt":"hi","stream":true})");
  ASSERT_EQ(response.result_int(), 200);
  const std::string& body = response.body();
  EXPECT_LT(body.size(), size_t{4096}) << "the oversized event reached the client";
  ASSERT_TRUE(body.starts_with(first)) << body.substr(0, 200);
  const std::string rest = body.substr(first.size());
  ASSERT_TRUE(rest.starts_with("data: {\"error\"")) << rest.substr(0, 200);
  EXPECT_TRUE(rest.ends_with("\n\ndata: [DONE]\n\n")) << rest;
  const Json error = Json::parse(rest.substr(6, rest.find("\n\n") - 6))["error"];
  EXPECT_EQ(error["code"], "bad_gateway");
  EXPECT_NE(error["message"].get<std::string>().find(std::to_string(kMaxSseHeldBytes)),
            std::string::npos);
}

// A whole (non-streamed) answer is buffered before it is relayed: past the proxy's bound the
// client gets a 502 naming it, not a proxy holding the node's bytes without bound.
TEST_F(ProxyRelayTest, AWholeAnswerOverTheBoundIsABadGateway) {
  std::string reply =
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
  const size_t chunks = kMaxBufferedAnswerBytes / (size_t{1} << 20) + 1;
  for (size_t i = 0; i < chunks; ++i) reply += chunk(std::string(size_t{1} << 20, ' '));
  ScriptedServer node(reply);
  add_decode(node.url());
  const HttpResponseMessage response = call("POST", "/v1/completions", R"({"prompt":"hi"})");
  EXPECT_EQ(response.result_int(), 502);
  EXPECT_EQ(error_of(response).value("code", ""), "bad_gateway") << response.body();
  EXPECT_NE(error_of(response).value("message", "").find(std::to_string(kMaxBufferedAnswerBytes)),
            std::string::npos);
}

// Node error text may carry the cluster token (e.g. an echoed header): a client without the
// token gets it redacted, with node addresses, in a relayed error body, an SSE error event and
// the last refusal's 503; a token holder gets the text whole.
TEST_F(ProxyRelayTest, TheClusterTokenLeavesRelayedErrorText) {
  const std::string message = std::string("prefill http://10.0.0.9:8100 refused Bearer ") + kToken;
  const std::string error_body =
      Json{{"error", {{"message", message}, {"type", "server_error"}}}}.dump();
  const auto expect_redacted = [&](const std::string& body, const std::string& what) {
    EXPECT_EQ(body.find(kToken), std::string::npos) << what << ": " << body;
    EXPECT_EQ(body.find("10.0.0.9"), std::string::npos) << what << ": " << body;
    EXPECT_NE(body.find("refused Bearer <redacted>"), std::string::npos) << what << ": " << body;
  };
  {
    RecordingNode node({400, "application/json", {}, error_body});
    add_decode(node.url());
    for (const char* path : {"/v1/completions", "/tokenize"}) {
      const HttpResponseMessage plain = call("POST", path, kCompletion);
      EXPECT_EQ(plain.result_int(), 400);
      expect_redacted(plain.body(), path);
      EXPECT_NE(call("POST", path, kCompletion, kTokenAuth).body().find(kToken), std::string::npos)
          << "a token holder sees the node's text whole";
    }
  }
  remove_nodes();
  {
    RecordingNode refusing({503, "application/json", {}, error_body});
    add_decode(refusing.url());
    const HttpResponseMessage refused = call("POST", "/v1/completions", kCompletion);
    EXPECT_EQ(refused.result_int(), 503);
    expect_redacted(refused.body(), "the last refusal");
  }
  remove_nodes();
  const std::string stream = "data: " + error_body + "\n\ndata: [DONE]\n\n";
  ScriptedServer streaming(reply_200("text/event-stream", stream));
  add_decode(streaming.url());
  const HttpResponseMessage events =
      call("POST", "/v1/completions", R"({"prompt":"hi","stream":true})");
  EXPECT_EQ(events.result_int(), 200);
  expect_redacted(events.body(), "an SSE error event");
}

}  // namespace
}  // namespace pdserve::proxy
