// Through a real ProxyServer and HttpServer over raw sockets: what a token holder or a broken
// node can send to the cluster API (bodies nested 500k levels deep, impossible load reports),
// and an HTTP/1.0 client of a relayed stream.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/http/http_client.h"
#include "common/http/http_server.h"
#include "proxy/proxy_server.h"
#include "tests/http/test_client.h"

namespace pdserve::proxy {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;
using testing::make_request;
using testing::TestClient;

constexpr char kToken[] = "cluster-secret";
constexpr char kAuth[] = "Authorization: Bearer cluster-secret\r\n";
// Far past any stack: the crash this guards against was a recursive dump / copy of the value.
constexpr size_t kDeepLevels = 500'000;

class ProxyServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    client_ = std::move(http::HttpClient::create(1).value());
    ProxyOptions options;
    options.cluster_token = kToken;
    proxy_ = std::make_unique<ProxyServer>(registry_, *client_, options);
    http::Router router;
    proxy_->register_routes(router);
    server_ = std::move(http::HttpServer::start({}, std::move(router)).value());
  }
  void TearDown() override {
    server_->stop();
    client_.reset();
  }

  // One request on a fresh connection; the response, or a failed expectation.
  testing::HttpResponseMessage call(const std::string& method, const std::string& target,
                                    const std::string& body = "") {
    TestClient client(server_->port());
    EXPECT_TRUE(client.send(make_request(method, target, body, kAuth)));
    std::optional<testing::HttpResponseMessage> response = client.read_response(10'000ms);
    EXPECT_TRUE(response.has_value()) << method << " " << target << ": no response";
    return response ? std::move(*response) : testing::HttpResponseMessage{};
  }

  std::string register_decode(int port) {
    const Json body = {{"role", "decode"},
                       {"url", "http://127.0.0.1:" + std::to_string(port)},
                       {"kv_blocks_total", 100}};
    const testing::HttpResponseMessage response = call("POST", "/cluster/nodes", body.dump());
    EXPECT_EQ(response.result_int(), 200) << response.body();
    return Json::parse(response.body()).value("id", "");
  }

  Json cluster_node(const std::string& id) {
    const Json cluster = Json::parse(call("GET", "/cluster").body());
    for (const Json& node : cluster["nodes"]) {
      if (node["id"] == id) return node;
    }
    return Json();
  }

  void expect_alive() {
    const testing::HttpResponseMessage health = call("GET", "/health");
    EXPECT_EQ(health.result_int(), 200);
  }

  static void expect_invalid_request(const testing::HttpResponseMessage& response,
                                     const std::string& message_part) {
    EXPECT_EQ(response.result_int(), 400) << response.body();
    const Json body = Json::parse(response.body(), nullptr, false);
    ASSERT_TRUE(body.is_object()) << response.body();
    EXPECT_EQ(body["error"]["type"], "invalid_request_error");
    EXPECT_NE(body["error"]["message"].get<std::string>().find(message_part), std::string::npos)
        << body.dump();
  }

  NodeRegistry registry_{RegistryOptions{}};
  std::unique_ptr<http::HttpClient> client_;
  std::unique_ptr<ProxyServer> proxy_;
  std::unique_ptr<http::HttpServer> server_;
};

TEST_F(ProxyServerTest, DeeplyNestedRegistrationIs400AndTheProxyLives) {
  const std::string arrays = R"({"role": "decode", "url": "http://127.0.0.1:9000", "x": )" +
                             std::string(kDeepLevels, '[') + std::string(kDeepLevels, ']') + "}";
  expect_invalid_request(call("POST", "/cluster/nodes", arrays), "nests deeper than 64 levels");
  expect_alive();
  EXPECT_TRUE(Json::parse(call("GET", "/cluster").body())["nodes"].empty());
}

TEST_F(ProxyServerTest, DeeplyNestedHeartbeatIs400AndLeavesTheLoadAlone) {
  const std::string id = register_decode(9000);
  ASSERT_FALSE(id.empty());
  std::string objects = R"({"load": )";
  for (size_t i = 0; i < kDeepLevels; ++i) objects += R"({"a": )";
  objects += "1" + std::string(kDeepLevels + 1, '}');
  expect_invalid_request(call("POST", "/cluster/nodes/" + id + "/heartbeat", objects),
                         "nests deeper than 64 levels");
  expect_alive();
  EXPECT_EQ(cluster_node(id)["load"]["kv_blocks_total"], 100);
}

TEST_F(ProxyServerTest, ImpossibleLoadIs400AndDoesNotWinRouting) {
  const std::string honest = register_decode(9000);
  const std::string liar = register_decode(9001);
  const auto heartbeat = [&](const std::string& id, const Json& load) {
    return call("POST", "/cluster/nodes/" + id + "/heartbeat", Json{{"load", load}}.dump());
  };
  const Json lighter = {
      {"num_running", 4}, {"num_waiting", 0}, {"kv_blocks_total", 100}, {"kv_blocks_used", 40}};
  const Json busier = {
      {"num_running", 4}, {"num_waiting", 1}, {"kv_blocks_total", 100}, {"kv_blocks_used", 50}};
  ASSERT_EQ(heartbeat(honest, lighter).result_int(), 200);
  ASSERT_EQ(heartbeat(liar, busier).result_int(), 200);

  const std::vector<std::pair<Json, std::string>> lies = {
      {{{"kv_blocks_total", 100}, {"kv_blocks_used", -1000}}, "'kv_blocks_used'"},
      {{{"kv_blocks_total", 100}, {"kv_blocks_used", 101}}, "exceeds 'kv_blocks_total'"},
      {{{"num_running", -5}}, "'num_running'"},
      {{{"num_waiting", int64_t{1} << 32}}, "'num_waiting'"},  // wraps to 0 as an int
      {{{"kv_blocks_total", 1.5}}, "'kv_blocks_total'"},
  };
  for (const auto& [load, message] : lies) {
    expect_invalid_request(heartbeat(liar, load), message);
  }
  expect_invalid_request(call("POST", "/cluster/nodes/" + liar + "/heartbeat", "not json"),
                         "not valid JSON");
  const Json kept = cluster_node(liar)["load"];
  for (const auto& [name, value] : busier.items()) EXPECT_EQ(kept[name], value) << name;

  const std::optional<NodeRef> picked = registry_.pick_decode({}, NodeRegistry::Clock::now());
  ASSERT_TRUE(picked.has_value());
  EXPECT_EQ(picked->id, honest);
}

// The proxy relays a decode node's SSE stream to an HTTP/1.0 client without chunking (HTTP/1.0
// has none) and closes the connection to end it.
TEST_F(ProxyServerTest, Http10ClientGetsTheRelayedStreamUnchunked) {
  const std::string events =
      "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\n"
      "data: [DONE]\n\n";
  http::Router decode_routes;
  decode_routes.add("POST", "/v1/completions",
                    [&events](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> ch) {
                      ch->start_stream(200, "text/event-stream", {});
                      ch->write(events.substr(0, 20));  // split mid-event
                      ch->write(events.substr(20));
                      ch->end_stream();
                    });
  std::unique_ptr<http::HttpServer> decode =
      std::move(http::HttpServer::start({}, std::move(decode_routes)).value());
  ASSERT_TRUE(
      registry_.add_static(NodeRole::kDecode, "http://127.0.0.1:" + std::to_string(decode->port()))
          .ok());

  TestClient client(server_->port());
  const std::string body = R"({"prompt": "hi", "stream": true})";
  ASSERT_TRUE(
      client.send("POST /v1/completions HTTP/1.0\r\nHost: t\r\nContent-Type: application/json\r\n"
                  "Content-Length: " +
                  std::to_string(body.size()) + "\r\n\r\n" + body));
  std::optional<std::string> bytes = client.read_until_closed(10'000ms);
  decode->stop();
  ASSERT_TRUE(bytes) << "the proxy must close the connection to end the stream";
  const size_t head_end = bytes->find("\r\n\r\n");
  ASSERT_NE(head_end, std::string::npos) << *bytes;
  const std::string head = bytes->substr(0, head_end + 2);
  EXPECT_NE(head.find(" 200 "), std::string::npos) << head;
  EXPECT_EQ(head.find("Transfer-Encoding"), std::string::npos) << head;
  EXPECT_NE(head.find("Connection: close\r\n"), std::string::npos) << head;
  EXPECT_EQ(bytes->substr(head_end + 4), events);
}

}  // namespace
}  // namespace pdserve::proxy
