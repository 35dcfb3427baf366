// Aborts through the OpenAI API server: a client that disconnects aborts every choice, a failed
// choice aborts its siblings, over the fake service and over the real LlmEngine.
#include "common/engine/llm_engine.h"
#include "tests/api/api_server_fixture.h"
#include "tests/engine/scripted_executor.h"

namespace pdserve::api_test {
namespace {

TEST_F(ApiServerTest, DisconnectAbortsEveryFannedOutRequest) {
  std::vector<std::string> long_script(60, "t");
  start(long_script);
  service_->set_step_delay(20ms);
  TestClient client(server_->port());
  ASSERT_TRUE(client.send(make_request("POST", "/v1/completions",
                                       R"({"prompt": ["a", "b"], "n": 2, "max_tokens": 50,
                                           "stream": true})")));
  ASSERT_TRUE(client.read_response_header());
  EXPECT_FALSE(client.read_some(64, 2000ms).empty());
  client.close();
  const std::set<std::string> aborted = service_->wait_for_aborts(4);
  const std::vector<std::string> submitted = service_->submitted();
  ASSERT_EQ(submitted.size(), 4u);
  EXPECT_EQ(aborted, std::set<std::string>(submitted.begin(), submitted.end()));
}

TEST_F(ApiServerTest, FailedChoiceAbortsItsSiblings) {
  start(std::vector<std::string>(60, "t"));
  service_->set_step_delay(5ms);
  service_->fail_requests("-1", 2, internal_error("injected failure"));
  auto response = post("/v1/completions", R"({"prompt": "a", "n": 3, "max_tokens": 50})");
  EXPECT_EQ(response.result_int(), 500) << response.body();
  EXPECT_NE(response.body().find("injected failure"), std::string::npos) << response.body();
  const std::vector<std::string> submitted = service_->submitted();
  ASSERT_EQ(submitted.size(), 3u);
  EXPECT_EQ(service_->wait_for_aborts(2), std::set<std::string>({submitted[0], submitted[2]}));
  // One client request, one response counted.
  EXPECT_EQ(metric_value(scrape_metrics(), "pdserve:http_requests_total{status=\"500\"}"), 1.0);
}

TEST_F(ApiServerTest, FailedChoiceOfAStreamEndsItWithAnErrorEventAndAbortsItsSiblings) {
  start(std::vector<std::string>(60, "t"));
  service_->set_step_delay(5ms);
  service_->fail_requests("-0", 1, internal_error("injected failure"));
  auto response =
      post("/v1/completions", R"({"prompt": ["a", "b"], "max_tokens": 50, "stream": true})");
  ASSERT_EQ(response.result_int(), 200) << response.body();
  bool done = false;
  const std::vector<Json> events = sse_events(response.body(), done);
  EXPECT_TRUE(done);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["error"]["message"], "injected failure") << response.body();
  const std::vector<std::string> submitted = service_->submitted();
  ASSERT_EQ(submitted.size(), 2u);
  EXPECT_EQ(service_->wait_for_aborts(1), std::set<std::string>({submitted[1]}));
}

// The same over the real engine: the failing choice's sink aborts its siblings from the engine
// thread (LlmEngine::abort only takes the intake mutex, which is free while sinks run), and
// they stop at the next step instead of running to max_tokens.
TEST(ApiServerOverLlmEngineTest, FailedChoiceAbortsItsSiblingsInTheEngine) {
  constexpr int kVocab = 151936;
  auto executor = std::make_unique<testing::ScriptedExecutor>(kVocab);
  testing::ScriptedExecutor& model = *executor;
  model.set_script(1000, {1001, 1002, 1003});
  model.nan_for(2000);  // requests whose prompt starts with 2000 fail at their first sample
  model.set_step_delay(2ms);
  LlmEngineConfig config;
  config.scheduler.num_blocks = 256;
  config.scheduler.block_size = 4;
  config.scheduler.max_num_batched_tokens = 64;
  config.scheduler.max_num_seqs = 16;
  config.scheduler.max_num_waiting = 64;
  config.scheduler.max_model_len = 512;
  config.scheduler.vocab_size = kVocab;
  config.scheduler.eos_token_ids = {151645};
  config.model_name = "scripted";
  std::unique_ptr<LlmEngine> engine =
      LlmEngine::create(std::move(executor), tokenizer(), std::move(config)).value();
  ASSERT_TRUE(engine->start().ok());
  OpenAiServer api(*engine, tokenizer(), chat_template());
  http::RouteTable router;
  api.register_routes(router);
  std::unique_ptr<http::HttpServer> server = http::HttpServer::start({}, std::move(router)).value();

  TestClient client(server->port());
  ASSERT_TRUE(client.send(make_request("POST", "/v1/completions",
                                       R"({"prompt": [[1000, 11, 12], [2000, 11, 12]], "n": 2,
                                           "max_tokens": 400, "temperature": 0})")));
  auto response = client.read_response();
  ASSERT_TRUE(response);
  EXPECT_EQ(response->result_int(), 500) << response->body();
  EXPECT_NE(response->body().find("NaN"), std::string::npos) << response->body();

  // Polled: the engine publishes its stats after each step and has no idle event.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  ServiceStats stats = engine->stats();
  while ((stats.num_running > 0 || stats.num_waiting > 0 || stats.kv_blocks_used > 0) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
    stats = engine->stats();
  }
  EXPECT_EQ(stats.num_running, 0);
  EXPECT_EQ(stats.num_waiting, 0);
  EXPECT_EQ(stats.kv_blocks_used, 0);
  EXPECT_LT(model.steps(), 100) << "the siblings ran on instead of being aborted";
  server->stop();
  engine->stop();
}

}  // namespace
}  // namespace pdserve::api_test
