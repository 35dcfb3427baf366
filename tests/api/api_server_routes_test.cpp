// The OpenAI API server's other routes: tokenize and detokenize, models, health, readiness and
// version, and the API keys that guard them.
#include "common/http/service_routes.h"
#include "tests/api/api_server_fixture.h"

namespace pdserve::api_test {
namespace {

TEST_F(ApiServerTest, TokenizeAndDetokenizeInVllmsShapes) {
  start({"x"});
  const std::vector<int32_t> ids = tokenizer().encode("Hello world").value();
  auto tokenized = post("/tokenize", R"({"prompt": "Hello world", "add_special_tokens": true,
      "return_token_strs": true})");
  ASSERT_EQ(tokenized.result_int(), 200) << tokenized.body();
  const Json body = Json::parse(tokenized.body());
  EXPECT_EQ(body["tokens"], Json(ids));
  EXPECT_EQ(body["count"], ids.size());
  EXPECT_EQ(body["max_model_len"], 64);
  EXPECT_EQ(body["token_strs"], Json::array({"Hello", "\u0120world"}));
  auto chat = post("/tokenize", R"({"messages": [{"role": "user", "content": "Hello!"}],
      "chat_template_kwargs": {"enable_thinking": false}})");
  ASSERT_EQ(chat.result_int(), 200) << chat.body();
  EXPECT_EQ(Json::parse(chat.body())["tokens"],
            Json(tokenizer()
                     .encode("<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
                             "<think>\n\n</think>\n\n")
                     .value()));
  EXPECT_TRUE(Json::parse(chat.body())["token_strs"].is_null());
  auto detokenized = post("/detokenize", "{\"tokens\": " + Json(ids).dump() + "}");
  ASSERT_EQ(detokenized.result_int(), 200) << detokenized.body();
  EXPECT_EQ(Json::parse(detokenized.body()), Json({{"prompt", "Hello world"}}));
  EXPECT_EQ(post("/detokenize", R"({"tokens": [151936]})").result_int(), 400);
  EXPECT_EQ(post("/tokenize", R"({"prompt": "x", "messages": []})").result_int(), 400);
  EXPECT_EQ(post("/tokenize", R"({"prompt": "x", "model": "other"})").result_int(), 404);
}

TEST_F(ApiServerTest, ModelByIdReadinessAndVersion) {
  start({"x"});
  TestClient client(server_->port());
  const auto get = [&](const std::string& target) {
    EXPECT_TRUE(client.send(make_request("GET", target)));
    auto response = client.read_response();
    EXPECT_TRUE(response);
    return response ? *response : testing::HttpResponseMessage{};
  };
  auto model = get("/v1/models/fake-model");
  ASSERT_EQ(model.result_int(), 200) << model.body();
  EXPECT_EQ(Json::parse(model.body())["id"], "fake-model");
  EXPECT_EQ(Json::parse(model.body())["object"], "model");
  auto missing = get("/v1/models/other%2Fmodel");
  EXPECT_EQ(missing.result_int(), 404);
  EXPECT_EQ(Json::parse(missing.body())["error"]["code"], "model_not_found");
  EXPECT_NE(Json::parse(missing.body())["error"]["message"].get<std::string>().find("other/model"),
            std::string::npos);
  // A node's port opens once its model is loaded: it is ready whenever it answers.
  EXPECT_EQ(get("/ready").body(), R"({"ready":true})");
  EXPECT_EQ(get("/health?ready=1").body(), R"({"ready":true})");
  EXPECT_EQ(get("/health").body(), "{}");
  EXPECT_EQ(Json::parse(get("/version").body())["version"], http::pdserve_version());
}

TEST_F(ApiServerTest, ModelsHealthAndMetrics) {
  start({"x"});
  TestClient client(server_->port());
  ASSERT_TRUE(client.send(make_request("GET", "/v1/models")));
  auto models = client.read_response();
  ASSERT_TRUE(models);
  EXPECT_EQ(Json::parse(models->body())["data"][0]["id"], "fake-model");
  ASSERT_TRUE(client.send(make_request("GET", "/health")));
  auto health = client.read_response();
  ASSERT_TRUE(health);
  EXPECT_EQ(health->result_int(), 200);
  ASSERT_TRUE(client.send(make_request("GET", "/metrics")));
  auto metrics = client.read_response();
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body().find("pdserve:http_requests_total{status=\"200\"} 3"),
            std::string::npos)
      << metrics->body();
  EXPECT_NE(metrics->body().find("# TYPE vllm:num_requests_running gauge"), std::string::npos);
}

// With API keys, the OpenAI routes need one of them (or the cluster token, which the proxy
// presents); health and metrics stay open.
TEST_F(ApiServerTest, ApiKeysGuardTheOpenAiRoutes) {
  start({"a"}, OpenAiOptions{.strict_request_fields = false, .access = {"cluster-secret", {"key-1"}}});
  const auto call = [&](const std::string& method, const std::string& path,
                        const std::string& headers) {
    TestClient client(server_->port());
    EXPECT_TRUE(
        client.send(make_request(method, path, R"({"prompt": "x", "max_tokens": 1})", headers)));
    auto response = client.read_response();
    return response ? response->result_int() : 0;
  };
  for (const std::string path : {"/v1/completions", "/v1/chat/completions", "/v1/models"}) {
    const std::string method = path == "/v1/models" ? "GET" : "POST";
    EXPECT_EQ(call(method, path, ""), 401) << path;
    EXPECT_EQ(call(method, path, "Authorization: Bearer key-2\r\n"), 401) << path;
    EXPECT_EQ(call(method, path, "Authorization: key-1\r\n"), 401) << path;
  }
  EXPECT_EQ(call("POST", "/v1/completions", "Authorization: Bearer key-1\r\n"), 200);
  EXPECT_EQ(call("POST", "/v1/completions", "Authorization: Bearer cluster-secret\r\n"), 200);
  EXPECT_EQ(call("GET", "/v1/models", "Authorization: Bearer key-1\r\n"), 200);
  EXPECT_EQ(call("GET", "/health", ""), 200);
  EXPECT_EQ(call("GET", "/metrics", ""), 200);
  TestClient client(server_->port());
  ASSERT_TRUE(client.send(make_request("GET", "/v1/models", "", "")));
  auto refused = client.read_response();
  ASSERT_TRUE(refused);
  const Json body = Json::parse(refused->body());
  EXPECT_EQ(body["error"]["code"], "invalid_api_key");
  EXPECT_EQ((*refused)["WWW-Authenticate"], "Bearer");
}

}  // namespace
}  // namespace pdserve::api_test
