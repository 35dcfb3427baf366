// The OpenAI API server's logprobs, completions and chat, whole and streamed, against
// hand-written expectations.
#include "tests/api/api_server_fixture.h"

namespace pdserve::api_test {
namespace {

int32_t single_token(std::string_view text) {
  const std::vector<int32_t> ids = tokenizer().encode(text).value();
  EXPECT_EQ(ids.size(), 1u) << text;
  return ids.at(0);
}

// kHelloWorldScript's tokens, each with its two best alternatives.
std::vector<SampledTokenLogprobs> hello_world_logprobs() {
  const int32_t byte_e4 = tokenizer().token_to_id("\u00e4").value();  // byte-level spelling
  return {{single_token("Hello"),
           -0.25f,
           {{single_token("Hello"), -0.25f}, {single_token("Hi"), -1.5f}}},
          {byte_e4, -2.0f, {{byte_e4, -2.0f}, {single_token("!"), -2.5f}}},
          {single_token(" world"),
           -0.5f,
           {{single_token(" world"), -0.5f}, {single_token(" there"), -1.0f}}}};
}

// Hand-written: what completions `logprobs: 2` must return for hello_world_logprobs().
const Json kHelloWorldCompletionLogprobs = Json::parse(R"({
  "tokens": ["Hello", "bytes:\\xe4", " world"],
  "token_logprobs": [-0.25, -2.0, -0.5],
  "top_logprobs": [{"Hello": -0.25, "Hi": -1.5}, {"bytes:\\xe4": -2.0, "!": -2.5},
                   {" world": -0.5, " there": -1.0}],
  "text_offset": [0, 5, 6]})");

// Hand-written: chat `logprobs: true, top_logprobs: 1` for hello_world_logprobs().
const Json kHelloWorldChatLogprobs = Json::parse(R"([
  {"token": "Hello", "logprob": -0.25, "bytes": [72, 101, 108, 108, 111],
   "top_logprobs": [{"token": "Hello", "logprob": -0.25, "bytes": [72, 101, 108, 108, 111]}]},
  {"token": "bytes:\\xe4", "logprob": -2.0, "bytes": [228],
   "top_logprobs": [{"token": "bytes:\\xe4", "logprob": -2.0, "bytes": [228]}]},
  {"token": " world", "logprob": -0.5, "bytes": [32, 119, 111, 114, 108, 100],
   "top_logprobs": [{"token": " world", "logprob": -0.5, "bytes": [32, 119, 111, 114, 108, 100]}]}
])");

TEST_F(ApiServerTest, CompletionLogprobs) {
  start(kHelloWorldScript);
  service_->set_logprobs(hello_world_logprobs());
  auto response = post("/v1/completions", R"({"prompt": "Say hi", "logprobs": 2})");
  ASSERT_EQ(response.result_int(), 200) << response.body();
  const Json choice = Json::parse(response.body())["choices"][0];
  EXPECT_EQ(choice["text"], "Hello world");
  EXPECT_EQ(choice["logprobs"], kHelloWorldCompletionLogprobs);
}

TEST_F(ApiServerTest, CompletionWithoutLogprobsHasNullLogprobs) {
  start(kHelloWorldScript);
  service_->set_logprobs(hello_world_logprobs());
  auto response = post("/v1/completions", R"({"prompt": "Say hi"})");
  ASSERT_EQ(response.result_int(), 200) << response.body();
  EXPECT_TRUE(Json::parse(response.body())["choices"][0]["logprobs"].is_null());
}

TEST_F(ApiServerTest, StreamedCompletionLogprobsComeOnePerChunkWithRunningTextOffsets) {
  start(kHelloWorldScript);
  service_->set_logprobs(hello_world_logprobs());
  auto response = post("/v1/completions", R"({"prompt": "Say hi", "logprobs": 2, "stream": true})");
  ASSERT_EQ(response.result_int(), 200) << response.body();
  bool done = false;
  const std::vector<Json> events = sse_events(response.body(), done);
  EXPECT_TRUE(done);
  // The token without text still gets its chunk, so no logprob is lost.
  ASSERT_EQ(events.size(), 3u) << response.body();
  const Json& whole = kHelloWorldCompletionLogprobs;
  for (size_t k = 0; k < events.size(); ++k) {
    const Json expected = {{"tokens", {whole["tokens"][k]}},
                           {"token_logprobs", {whole["token_logprobs"][k]}},
                           {"top_logprobs", {whole["top_logprobs"][k]}},
                           {"text_offset", {whole["text_offset"][k]}}};
    EXPECT_EQ(events[k]["choices"][0]["logprobs"], expected) << k;
    EXPECT_EQ(events[k]["choices"][0]["text"], kHelloWorldScript[k]);
  }
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "stop");
}

TEST_F(ApiServerTest, ChatLogprobs) {
  start(kHelloWorldScript);
  service_->set_logprobs(hello_world_logprobs());
  auto response = post("/v1/chat/completions",
                       R"({"messages": [{"role": "user", "content": "q"}], "logprobs": true,
                           "top_logprobs": 1})");
  ASSERT_EQ(response.result_int(), 200) << response.body();
  const Json choice = Json::parse(response.body())["choices"][0];
  EXPECT_EQ(choice["message"]["content"], "Hello world");
  EXPECT_EQ(choice["logprobs"], Json({{"content", kHelloWorldChatLogprobs}}));
}

TEST_F(ApiServerTest, StreamedChatLogprobsComeWithTheirTokens) {
  start(kHelloWorldScript);
  service_->set_logprobs(hello_world_logprobs());
  auto response = post("/v1/chat/completions",
                       R"({"messages": [{"role": "user", "content": "q"}], "logprobs": true,
                           "top_logprobs": 1, "stream": true})");
  ASSERT_EQ(response.result_int(), 200) << response.body();
  bool done = false;
  const std::vector<Json> events = sse_events(response.body(), done);
  EXPECT_TRUE(done);
  Json streamed = Json::array();
  for (const Json& event : events) {
    const Json& logprobs = event["choices"][0]["logprobs"];
    if (logprobs.is_null()) continue;
    ASSERT_EQ(logprobs["content"].size(), 1u) << event;  // one engine token per delta
    streamed.push_back(logprobs["content"][0]);
  }
  EXPECT_EQ(streamed, kHelloWorldChatLogprobs);
}

TEST_F(ApiServerTest, EchoWithLogprobsIsRefused) {
  start(kHelloWorldScript);
  auto response = post("/v1/completions", R"({"prompt": "Say hi", "echo": true, "logprobs": 0})");
  EXPECT_EQ(response.result_int(), 400) << response.body();
  const Json error = Json::parse(response.body())["error"];
  EXPECT_EQ(error["param"], "echo");
  EXPECT_NE(error["message"].get<std::string>().find("prompt logprobs"), std::string::npos);
  EXPECT_TRUE(service_->submitted().empty());
}

}  // namespace
}  // namespace pdserve::api_test
