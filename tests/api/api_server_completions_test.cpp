// The OpenAI API server's completions: echo and usage, fan-out of prompt lists and n, seeds,
// request errors, unknown fields, response ids and a full queue.
#include "tests/api/api_server_fixture.h"

namespace pdserve::api_test {
namespace {

TEST_F(ApiServerTest, CompletionWithEchoAndUsage) {
  start({"Hello", " world", "!"});
  auto response =
      post("/v1/completions", R"({"model": "fake-model", "prompt": "Say hi", "echo": true})");
  ASSERT_EQ(response.result_int(), 200) << response.body();
  const Json body = Json::parse(response.body());
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], "Say hiHello world!");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["prompt_tokens"], tokenizer().encode("Say hi").value().size());
  EXPECT_EQ(body["usage"]["completion_tokens"], 3);
}

TEST_F(ApiServerTest, PromptListAndNFanOutIntoOneEngineRequestPerChoice) {
  start({"a", "b", "c", "d"});
  auto response =
      post("/v1/completions", R"({"prompt": ["one", "two three"], "n": 2, "max_tokens": 2})");
  ASSERT_EQ(response.result_int(), 200) << response.body();
  const Json body = Json::parse(response.body());
  ASSERT_EQ(body["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(body["choices"][i]["index"], i);
    EXPECT_EQ(body["choices"][i]["text"], "ab");
    EXPECT_EQ(body["choices"][i]["finish_reason"], "length");
  }
  EXPECT_EQ(service_->submitted().size(), 4u);
  // Prompt tokens count once per prompt, completion tokens once per choice.
  EXPECT_EQ(body["usage"]["prompt_tokens"], tokenizer().encode("one").value().size() +
                                                tokenizer().encode("two three").value().size());
  EXPECT_EQ(body["usage"]["completion_tokens"], 8);
}

// vLLM's parallel sampling: choice i of every prompt draws with seed + i; logit_bias reaches the
// engine's sampling parameters.
TEST_F(ApiServerTest, SeededChoicesDrawWithSeedPlusTheirIndexAndLogitBiasReachesTheEngine) {
  start({"a", "b"});
  auto response = post("/v1/completions", R"({"prompt": ["one", "two"], "n": 3, "seed": 10,
      "logit_bias": {"7": 100, "3": -5.5}})");
  ASSERT_EQ(response.result_int(), 200) << response.body();
  std::vector<std::optional<uint64_t>> seeds;
  for (const SamplingParams& sampling : service_->submitted_sampling()) {
    seeds.push_back(sampling.seed);
    EXPECT_EQ(sampling.logit_bias, (std::vector<LogitBias>{{7, 100.0f}, {3, -5.5f}}));
  }
  EXPECT_EQ(seeds, (std::vector<std::optional<uint64_t>>{10, 11, 12, 10, 11, 12}));
  ASSERT_EQ(post("/v1/completions", R"({"prompt": "one", "n": 2})").result_int(), 200);
  const std::vector<SamplingParams> unseeded = service_->submitted_sampling();
  EXPECT_FALSE(unseeded.at(6).seed);
  EXPECT_FALSE(unseeded.at(7).seed);
}

TEST_F(ApiServerTest, ErrorPaths) {
  start({"x"});
  struct Case {
    std::string path, body;
    int status;
    std::string param_or_code;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", R"({"prompt": "a",)", 400, ""},
      {"/v1/completions", R"({"prompt": 5})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": "a", "stream": true, "stream_options": {"usage": true}})",
       400, "stream_options.usage"},
      {"/v1/completions", R"({"prompt": "a", "model": "other"})", 404, "model_not_found"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 1000})", 400, ""},
      {"/v1/chat/completions", R"({"messages": "hi"})", 400, "messages"},
  };
  for (const Case& c : cases) {
    auto response = post(c.path, c.body);
    EXPECT_EQ(response.result_int(), c.status) << c.body << " -> " << response.body();
    const Json error = Json::parse(response.body())["error"];
    EXPECT_TRUE(error.contains("message") && error.contains("type")) << response.body();
    if (!c.param_or_code.empty()) {
      EXPECT_TRUE(error["param"] == c.param_or_code || error["code"] == c.param_or_code)
          << response.body();
    }
  }
  EXPECT_TRUE(service_->submitted().empty());
}

// vLLM's default: an unknown top-level field is ignored and the request served;
// --strict-request-fields refuses it, naming the field.
TEST_F(ApiServerTest, UnknownTopLevelFieldIsServedUnlessStrict) {
  const std::string body = R"({"prompt": "a", "max_tokens": 1, "temprature": 1})";
  start({"x"});
  EXPECT_EQ(post("/v1/completions", body).result_int(), 200);
  EXPECT_EQ(service_->submitted().size(), 1u);
  server_->stop();
  start({"x"}, OpenAiOptions{.strict_request_fields = true, .access = {}});
  auto refused = post("/v1/completions", body);
  EXPECT_EQ(refused.result_int(), 400);
  EXPECT_EQ(Json::parse(refused.body())["error"]["param"], "temprature") << refused.body();
  EXPECT_TRUE(service_->submitted().empty());
}

// Ids must not repeat across node restarts or across the nodes behind one proxy (they used to
// restart at cmpl-...0001): a random per-server part, then a counter.
TEST_F(ApiServerTest, ResponseIdsAreUniqueAcrossServersAndRequests) {
  const std::string body = R"({"prompt": "a", "max_tokens": 1})";
  std::set<std::string> ids;
  for (int server = 0; server < 3; ++server) {
    if (server > 0) server_->stop();
    start({"x"});
    for (int request = 0; request < 2; ++request) {
      const std::string id = Json::parse(post("/v1/completions", body).body())["id"];
      EXPECT_TRUE(id.starts_with("cmpl-")) << id;
      EXPECT_EQ(id.size(), 5u + 32u) << id;
      EXPECT_TRUE(ids.insert(id).second) << "repeated id " << id;
    }
  }
}

TEST_F(ApiServerTest, QueueFullIs429WithRetryAfter) {
  start({"x"});
  service_->set_queue_full(true);
  auto response = post("/v1/completions", R"({"prompt": "a"})");
  EXPECT_EQ(response.result_int(), 429);
  EXPECT_EQ(response["Retry-After"], "1");
  EXPECT_EQ(Json::parse(response.body())["error"]["type"], "rate_limit_error");
}

}  // namespace
}  // namespace pdserve::api_test
