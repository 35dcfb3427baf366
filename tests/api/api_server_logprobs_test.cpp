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

// lm-eval's loglikelihood request: the prompt's tokens lead the logprobs, the first without one.
TEST_F(ApiServerTest, EchoWithLogprobsLeadsWithThePromptsTokens) {
  start(kHelloWorldScript);
  service_->set_logprobs(hello_world_logprobs());
  const std::string body =
      R"({"prompt": [9707, 1879, 9707], "echo": true, "logprobs": 1, "max_tokens": 1})";
  auto response = post("/v1/completions", body);
  ASSERT_EQ(response.result_int(), 200) << response.body();
  EXPECT_EQ(service_->submitted_sampling().at(0).prompt_logprobs, 1);
  const Json choice = Json::parse(response.body())["choices"][0];
  EXPECT_EQ(choice["text"], "Hello worldHelloHello");
  const Json& logprobs = choice["logprobs"];
  EXPECT_EQ(logprobs["tokens"], Json::parse(R"(["Hello", " world", "Hello", "Hello"])"));
  EXPECT_EQ(logprobs["token_logprobs"][3], hello_world_logprobs()[0].logprob);
  EXPECT_EQ(logprobs["token_logprobs"][0], nullptr);
  EXPECT_EQ(logprobs["top_logprobs"][0], nullptr);
  EXPECT_EQ(logprobs["token_logprobs"][1], -0.5);
  EXPECT_EQ(logprobs["token_logprobs"][2], -1.0);
  EXPECT_EQ(logprobs["top_logprobs"][1], Json::parse(R"({"!": -0.25})"));
  EXPECT_EQ(logprobs["text_offset"], Json::parse("[0, 5, 11, 16]"));
  EXPECT_FALSE(choice.contains("prompt_logprobs"));

  // Streamed: the echo and the prompt's logprobs come with the first token.
  auto streamed = post("/v1/completions", body.substr(0, body.size() - 1) + R"(, "stream": true})");
  ASSERT_EQ(streamed.result_int(), 200) << streamed.body();
  bool done = false;
  const std::vector<Json> events = sse_events(streamed.body(), done);
  ASSERT_TRUE(done);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0]["choices"][0]["text"], "Hello worldHelloHello");
  EXPECT_EQ(events[0]["choices"][0]["logprobs"], logprobs);
}

TEST_F(ApiServerTest, VllmPromptLogprobsOnCompletionsAndChat) {
  start(kHelloWorldScript);
  auto response =
      post("/v1/completions", R"({"prompt": [9707, 1879], "prompt_logprobs": 2, "max_tokens": 1})");
  ASSERT_EQ(response.result_int(), 200) << response.body();
  const Json choice = Json::parse(response.body())["choices"][0];
  EXPECT_EQ(choice["logprobs"], nullptr);
  EXPECT_EQ(choice["prompt_logprobs"], Json::parse(R"([null, {
      "1879": {"logprob": -0.5, "rank": 3, "decoded_token": " world"},
      "0": {"logprob": -0.25, "rank": 1, "decoded_token": "!"},
      "1": {"logprob": -0.375, "rank": 2, "decoded_token": "\""}}])"));
  auto chat = post("/v1/chat/completions",
                   R"({"messages": [{"role": "user", "content": "hi"}], "prompt_logprobs": 0})");
  ASSERT_EQ(chat.result_int(), 200) << chat.body();
  const Json answer = Json::parse(chat.body());
  ASSERT_TRUE(answer["prompt_logprobs"].is_array());
  const size_t prompt_tokens = answer["usage"]["prompt_tokens"].get<size_t>();
  ASSERT_EQ(answer["prompt_logprobs"].size(), prompt_tokens);
  EXPECT_EQ(answer["prompt_logprobs"][0], nullptr);
  EXPECT_EQ(answer["prompt_logprobs"][1].size(), 1u);  // the prompt token alone
  for (const char* refused : {R"({"prompt": "x", "prompt_logprobs": 21})",
                              R"({"prompt": "x", "prompt_logprobs": 1, "stream": true})"}) {
    auto error = post("/v1/completions", refused);
    EXPECT_EQ(error.result_int(), 400) << refused;
    EXPECT_EQ(Json::parse(error.body())["error"]["param"], "prompt_logprobs") << refused;
  }
}

}  // namespace
}  // namespace pdserve::api_test
