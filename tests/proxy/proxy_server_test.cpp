// Through a real ProxyServer and HttpServer over raw sockets: who may call what (the cluster
// token for /cluster* and /trace, API keys for the OpenAI API), what a token holder or a
// broken node can send to the cluster API (bodies nested 500k levels deep, impossible load
// reports), node addresses kept out of what clients see, and an HTTP/1.0 client of a relayed
// stream.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/http/http_client.h"
#include "common/http/http_server.h"
#include "common/http/service_routes.h"
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
    options.access.cluster_token = kToken;
    options.access.api_keys = {"client-key-1", "client-key-2"};
    proxy_ = std::make_unique<ProxyServer>(registry_, *client_, options);
    http::RouteTable router;
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
    return call_with(kAuth, method, target, body);
  }
  // `headers`: extra header lines, each ending in CRLF (e.g. another Authorization, or none).
  testing::HttpResponseMessage call_with(const std::string& headers, const std::string& method,
                                         const std::string& target, const std::string& body = "") {
    TestClient client(server_->port());
    EXPECT_TRUE(client.send(make_request(method, target, body, headers)));
    std::optional<testing::HttpResponseMessage> response = client.read_response(10'000ms);
    EXPECT_TRUE(response.has_value()) << method << " " << target << ": no response";
    return response ? std::move(*response) : testing::HttpResponseMessage{};
  }

  std::string register_decode(int port) {
    const Json body = {{"role", "decode"},
                       {"url", "http://127.0.0.1:" + std::to_string(port)},
                       {"model", "m"},
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

TEST_F(ProxyServerTest, PrefixCacheReportsAreAppliedAndBadOnesAre400) {
  const std::string id = register_decode(9000);
  const auto heartbeat = [&](const Json& report) {
    return call("POST", "/cluster/nodes/" + id + "/heartbeat",
                Json{{"load", {{"kv_blocks_total", 100}}}, {"prefix_cache", report}}.dump());
  };
  const Json good = PrefixCacheReport{16, false, {1, 2, 3}, {}}.to_json();
  ASSERT_EQ(heartbeat(good).result_int(), 200);
  EXPECT_EQ(cluster_node(id)["prefix_cache"], (Json{{"block_size", 16}, {"keys", 3}}));
  Json bad = good;
  bad["stored"].push_back(42);
  expect_invalid_request(heartbeat(bad), "16 lowercase hex digits");
  Json huge = good;
  huge["block_size"] = 1 << 20;
  expect_invalid_request(heartbeat(huge), "'block_size'");
  EXPECT_EQ(cluster_node(id)["prefix_cache"]["keys"], 3);  // nothing of a refused report
  const testing::HttpResponseMessage metrics = call("GET", "/metrics");
  EXPECT_NE(metrics.body().find("pdserve:proxy_prefix_index_keys 3"), std::string::npos);
}

TEST_F(ProxyServerTest, ClusterAndTraceEndpointsNeedTheClusterToken) {
  const std::string id = register_decode(9000);
  const std::vector<std::pair<std::string, std::string>> guarded = {
      {"GET", "/cluster"},
      {"GET", "/cluster/advice"},
      {"GET", "/trace"},
      {"POST", "/cluster/nodes"},
      {"POST", "/cluster/nodes/" + id + "/heartbeat"},
      {"POST", "/cluster/nodes/" + id + "/drain"},
      {"DELETE", "/cluster/nodes/" + id},
  };
  for (const std::string& credential :
       {std::string(), std::string("Authorization: Bearer client-key-1\r\n"),
        std::string("Authorization: Bearer cluster-secreT\r\n"),
        std::string("Authorization: cluster-secret\r\n")}) {
    for (const auto& [method, target] : guarded) {
      const testing::HttpResponseMessage response = call_with(credential, method, target, "{}");
      EXPECT_EQ(response.result_int(), 401) << method << " " << target << " with " << credential;
      EXPECT_EQ(response["WWW-Authenticate"], "Bearer");
      const Json body = Json::parse(response.body(), nullptr, false);
      EXPECT_EQ(body["error"]["code"], "invalid_cluster_token") << response.body();
    }
  }
  // Nothing changed, and what monitoring needs stays open.
  EXPECT_EQ(cluster_node(id)["state"], "up");
  EXPECT_EQ(call_with("", "GET", "/health").result_int(), 200);
  EXPECT_EQ(call_with("", "GET", "/metrics").result_int(), 200);
}

// /health is liveness; /ready (and /health?ready=1) answers 503 until a decode node is up.
TEST_F(ProxyServerTest, ReadyOnlyWithADecodeNodeUp) {
  EXPECT_EQ(call_with("", "GET", "/health").result_int(), 200);
  for (const char* target : {"/ready", "/health?ready=1", "/health?ready=true"}) {
    const testing::HttpResponseMessage not_ready = call_with("", "GET", target);
    EXPECT_EQ(not_ready.result_int(), 503) << target;
    EXPECT_NE(Json::parse(not_ready.body())["error"]["message"].get<std::string>().find(
                  "no decode node is up"),
              std::string::npos)
        << not_ready.body();
  }
  EXPECT_EQ(call_with("", "GET", "/health?ready=0").result_int(), 200);
  const std::string id = register_decode(9000);
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(call_with("", "GET", "/ready").body(), R"({"ready":true})");
  EXPECT_EQ(call_with("", "GET", "/health?ready=1").result_int(), 200);
  EXPECT_EQ(call("DELETE", "/cluster/nodes/" + id).result_int(), 200);
  EXPECT_EQ(call_with("", "GET", "/ready").result_int(), 503);
  EXPECT_EQ(Json::parse(call_with("", "GET", "/version").body())["version"],
            http::pdserve_version());
}

// With ready_needs_prefill a decode node alone is not enough.
TEST(ProxyReadinessTest, ReadyNeedsPrefillWaitsForAPrefillNodeToo) {
  NodeRegistry registry{RegistryOptions{}};
  std::unique_ptr<http::HttpClient> client = std::move(http::HttpClient::create(1).value());
  ProxyOptions options;
  options.ready_needs_prefill = true;
  ProxyServer proxy(registry, *client, options);
  http::RouteTable router;
  proxy.register_routes(router);
  std::unique_ptr<http::HttpServer> server =
      std::move(http::HttpServer::start({}, std::move(router)).value());
  const auto ready_status = [&] {
    TestClient test_client(server->port());
    EXPECT_TRUE(test_client.send(make_request("GET", "/ready")));
    auto response = test_client.read_response(10'000ms);
    return response ? response->result_int() : 0;
  };
  ASSERT_TRUE(registry.add_static(NodeRole::kDecode, "http://127.0.0.1:9000").ok());
  EXPECT_EQ(ready_status(), 503);
  ASSERT_TRUE(registry.add_static(NodeRole::kPrefill, "http://127.0.0.1:9001").ok());
  EXPECT_EQ(ready_status(), 200);
  server->stop();
}

TEST_F(ProxyServerTest, ApiKeysGuardTheOpenAiApi) {
  for (const std::string target : {"/v1/models", "/v1/models/m", "/v1/completions",
                                   "/v1/chat/completions", "/tokenize", "/detokenize"}) {
    const std::string method = target.starts_with("/v1/models") ? "GET" : "POST";
    const testing::HttpResponseMessage missing = call_with("", method, target, "{}");
    EXPECT_EQ(missing.result_int(), 401) << target;
    const Json body = Json::parse(missing.body(), nullptr, false);
    EXPECT_EQ(body["error"]["code"], "invalid_api_key") << missing.body();
    EXPECT_EQ(body["error"]["type"], "invalid_request_error");
    EXPECT_EQ(call_with("Authorization: Bearer client-key-3\r\n", method, target, "{}")
                  .result_int(),
              401)
        << target;
  }
  // Either key, or the cluster token, passes (no decode node here: 503 from behind the guard).
  for (const char* credential : {"Authorization: Bearer client-key-1\r\n",
                                 "Authorization: Bearer client-key-2\r\n", kAuth}) {
    EXPECT_EQ(call_with(credential, "GET", "/v1/models").result_int(), 503) << credential;
    EXPECT_EQ(call_with(credential, "POST", "/tokenize", "{}").result_int(), 503) << credential;
  }
}

// A fake decode node that fails with a node address in its messages, whole or mid-stream.
class FailingDecodeNode {
 public:
  static constexpr char kMessage[] = "KV import from prefill node http://10.9.8.7:8100 failed";

  explicit FailingDecodeNode(int status = 500) {
    http::RouteTable routes;
    routes.add("POST", "/v1/completions",
               [status](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
                 const std::string error =
                     Json{{"error", {{"message", kMessage}, {"type", "server_error"}, {"code", status}}}}
                         .dump();
                 if (status != 500 || request.body.find("stream") == std::string::npos) {
                   ch->send({status, "application/json", {}, error});
                   return;
                 }
                 ch->start_stream(200, "text/event-stream", {});
                 ch->write("data: {\"choices\":[{\"text\":\"a\"}]}\n\n");
                 ch->write("data: " + error + "\n\ndata: [DONE]\n\n");
                 ch->end_stream();
               });
    server_ = std::move(http::HttpServer::start({}, std::move(routes)).value());
  }
  ~FailingDecodeNode() { server_->stop(); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }

 private:
  std::unique_ptr<http::HttpServer> server_;
};

TEST_F(ProxyServerTest, NodeAddressesInErrorsReachOnlyClusterTokenHolders) {
  FailingDecodeNode decode;
  ASSERT_TRUE(registry_.add_static(NodeRole::kDecode, decode.url()).ok());
  const std::string client = "Authorization: Bearer client-key-1\r\n";
  for (const std::string body : {R"({"prompt": "hi"})", R"({"prompt": "hi", "stream": true})"}) {
    const testing::HttpResponseMessage redacted =
        call_with(client, "POST", "/v1/completions", body);
    EXPECT_EQ(redacted.body().find("10.9.8.7"), std::string::npos) << redacted.body();
    EXPECT_NE(redacted.body().find("KV import from prefill node <internal> failed"),
              std::string::npos)
        << redacted.body();
    const testing::HttpResponseMessage operator_view =
        call_with(kAuth, "POST", "/v1/completions", body);
    EXPECT_NE(operator_view.body().find(FailingDecodeNode::kMessage), std::string::npos)
        << operator_view.body();
  }
}

// Every decode node refuses with 503 because its prefill failed: the client gets that reason
// (addresses redacted), not a generic "no decode node could take the request".
TEST_F(ProxyServerTest, WhenEveryDecodeNodeRefusesTheClientGetsTheLastReason) {
  FailingDecodeNode first(503), second(503);
  ASSERT_TRUE(registry_.add_static(NodeRole::kDecode, first.url()).ok());
  ASSERT_TRUE(registry_.add_static(NodeRole::kDecode, second.url()).ok());
  const testing::HttpResponseMessage refused =
      call_with("Authorization: Bearer client-key-1\r\n", "POST", "/v1/completions",
                R"({"prompt": "hi"})");
  EXPECT_EQ(refused.result_int(), 503) << refused.body();
  EXPECT_EQ(refused["Retry-After"], "1");
  const Json body = Json::parse(refused.body(), nullptr, false);
  EXPECT_EQ(body["error"]["message"], "KV import from prefill node <internal> failed")
      << refused.body();
}

// The proxy relays a decode node's SSE stream to an HTTP/1.0 client without chunking (HTTP/1.0
// has none) and closes the connection to end it.
TEST_F(ProxyServerTest, Http10ClientGetsTheRelayedStreamUnchunked) {
  const std::string events =
      "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\n"
      "data: [DONE]\n\n";
  http::RouteTable decode_routes;
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
                  "Authorization: Bearer client-key-1\r\n"
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
