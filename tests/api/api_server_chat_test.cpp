// The OpenAI API server's chat completions: reasoning split from content, tool calls whole
// and streamed, continuous usage stats and echo.
#include "tests/api/api_server_fixture.h"

namespace pdserve::api_test {
namespace {

// Qwen3 thinks, says a word, then calls two tools (the template's format), cut into tokens
// that split tags and JSON.
const std::vector<std::string> kToolCallScript = {"<think>",
                                                  "\nweather?",
                                                  "\n</think>\n\n",
                                                  "Checking.\n\n",
                                                  "<tool_",
                                                  "call>\n{\"name\": ",
                                                  "\"get_weather\", \"arguments\": {\"city\": \"Os",
                                                  "lo\"}}\n</tool_call>",
                                                  "\n<tool_call>",
                                                  "\n{\"name\": \"now\", \"arguments\": {}}\n",
                                                  "</tool_call>"};
constexpr const char* kWithTools = R"({"messages": [{"role": "user", "content": "q"}],
    "tools": [{"type": "function", "function": {"name": "get_weather"}},
              {"type": "function", "function": {"name": "now"}}])";

// The choice's message as the openai client accumulates a stream: text fields concatenated,
// each tool call's id, type and name from its first entry, its arguments concatenated.
Json accumulate_stream(const std::vector<Json>& events, std::string& finish_reason) {
  Json message = {{"content", ""}, {"reasoning_content", ""}, {"tool_calls", Json::array()}};
  for (const Json& event : events) {
    if (event["choices"].empty()) continue;
    const Json& choice = event["choices"][0];
    const Json& delta = choice["delta"];
    for (const char* field : {"content", "reasoning_content"}) {
      if (delta.contains(field))
        message[field] = message[field].get<std::string>() + delta[field].get<std::string>();
    }
    for (const Json& call : delta.value("tool_calls", Json::array())) {
      const size_t index = call["index"];
      Json& calls = message["tool_calls"];
      if (index == calls.size()) {
        EXPECT_TRUE(call.contains("id") && call["type"] == "function" &&
                    call["function"].contains("name"))
            << "the first entry of a call names it: " << call;
        calls.push_back({{"id", call["id"]},
                         {"type", "function"},
                         {"function", {{"name", call["function"]["name"]}, {"arguments", ""}}}});
      }
      EXPECT_LT(index, calls.size()) << "calls come in index order";
      if (call["function"].contains("arguments")) {
        Json& arguments = calls[index]["function"]["arguments"];
        arguments = arguments.get<std::string>() + call["function"]["arguments"].get<std::string>();
      }
    }
    if (!choice["finish_reason"].is_null()) finish_reason = choice["finish_reason"];
  }
  return message;
}

TEST_F(ApiServerTest, StreamingChatSplitsReasoningAndEndsWithUsageAndDone) {
  start({"<think>", "\nponder", "\n</think>", "\n\nAnswer", "."});
  auto response = post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "q"}],
      "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_EQ(response.result_int(), 200) << response.body();
  EXPECT_EQ(response["Content-Type"], "text/event-stream");
  bool done = false;
  const std::vector<Json> events = sse_events(response.body(), done);
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
  std::string reasoning, content;
  std::string finish;
  for (const Json& event : events) {
    EXPECT_EQ(event["object"], "chat.completion.chunk");
    if (event["choices"].empty()) continue;
    const Json& choice = event["choices"][0];
    if (choice["delta"].contains("reasoning_content"))
      reasoning += choice["delta"]["reasoning_content"];
    if (choice["delta"].contains("content")) content += choice["delta"]["content"];
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  EXPECT_EQ(reasoning, "ponder");
  EXPECT_EQ(content, "Answer.");
  EXPECT_EQ(finish, "stop");
  EXPECT_TRUE(events.back()["choices"].empty());
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 5);
}

TEST_F(ApiServerTest, NonStreamingChatReturnsReasoningContent) {
  start({"<think>", "why", "</think>", "because"});
  auto response =
      post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "q"}]})");
  ASSERT_EQ(response.result_int(), 200) << response.body();
  const Json message = Json::parse(response.body())["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "why");
  EXPECT_EQ(message["content"], "because");
}

TEST_F(ApiServerTest, ToolCallsAfterTheReasoningWholeAndStreamed) {
  start(kToolCallScript);
  service_->set_max_model_len(1024);
  auto response = post("/v1/chat/completions", kWithTools + std::string("}"));
  ASSERT_EQ(response.result_int(), 200) << response.body();
  const Json choice = Json::parse(response.body())["choices"][0];
  const Json& message = choice["message"];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(message["reasoning_content"], "weather?");
  EXPECT_EQ(message["content"], "Checking.\n\n");
  ASSERT_EQ(message["tool_calls"].size(), 2u) << message;
  EXPECT_EQ(message["tool_calls"][0]["type"], "function");
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(message["tool_calls"][0]["function"]["arguments"], R"({"city": "Oslo"})");
  EXPECT_EQ(message["tool_calls"][1]["function"]["name"], "now");
  EXPECT_EQ(message["tool_calls"][1]["function"]["arguments"], "{}");
  const std::string first_id = message["tool_calls"][0]["id"];
  EXPECT_TRUE(first_id.starts_with("call_")) << first_id;
  EXPECT_NE(first_id, message["tool_calls"][1]["id"]);

  auto streamed = post("/v1/chat/completions", kWithTools + std::string(R"(, "stream": true})"));
  ASSERT_EQ(streamed.result_int(), 200) << streamed.body();
  bool done = false;
  std::string finish;
  const std::vector<Json> events = sse_events(streamed.body(), done);
  Json accumulated = accumulate_stream(events, finish);
  EXPECT_TRUE(done);
  EXPECT_EQ(finish, "tool_calls");
  // The first call's arguments come in the pieces the model wrote them in: with its name
  // ({"city": "Os), then the rest (lo"}).
  std::vector<Json> first_call_entries;
  for (const Json& event : events) {
    if (event["choices"].empty()) continue;
    for (const Json& call : event["choices"][0]["delta"].value("tool_calls", Json::array())) {
      if (call["index"] == 0) first_call_entries.push_back(call);
    }
  }
  ASSERT_EQ(first_call_entries.size(), 2u) << streamed.body();
  EXPECT_EQ(first_call_entries[0]["function"]["arguments"], R"({"city": "Os)");
  EXPECT_EQ(first_call_entries[1],
            Json::parse(R"({"index": 0, "function": {"arguments": "lo\"}"}})"));
  EXPECT_EQ(accumulated["reasoning_content"], message["reasoning_content"]);
  EXPECT_EQ(accumulated["content"], message["content"]);
  ASSERT_EQ(accumulated["tool_calls"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(accumulated["tool_calls"][i]["function"], message["tool_calls"][i]["function"]);
    EXPECT_TRUE(accumulated["tool_calls"][i]["id"].get<std::string>().starts_with("call_"));
  }
  // Ids are unique across responses too.
  EXPECT_NE(accumulated["tool_calls"][0]["id"], first_id);
}

TEST_F(ApiServerTest, ToolCallsAreContentWithoutToolsOrWithToolChoiceNone) {
  start(kToolCallScript);
  service_->set_max_model_len(1024);
  std::string text;
  for (size_t i = 3; i < kToolCallScript.size(); ++i) text += kToolCallScript[i];
  for (const std::string& body :
       {kWithTools + std::string(R"(, "tool_choice": "none"})"),
        std::string(R"({"messages": [{"role": "user", "content": "q"}]})")}) {
    auto response = post("/v1/chat/completions", body);
    ASSERT_EQ(response.result_int(), 200) << response.body();
    const Json choice = Json::parse(response.body())["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "stop");
    EXPECT_EQ(choice["message"]["content"], text);
    EXPECT_FALSE(choice["message"].contains("tool_calls"));
  }
}

// stream_options.continuous_usage_stats (with include_usage): every choice chunk carries the
// usage of its choice so far; the last chunk the whole usage.
TEST_F(ApiServerTest, ContinuousUsageStatsOnEveryChunk) {
  start({"Hello", " world", "!"});
  auto response = post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "q"}],
      "stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": true},
      "chat_template_kwargs": {"enable_thinking": false}})");
  ASSERT_EQ(response.result_int(), 200) << response.body();
  bool done = false;
  const std::vector<Json> events = sse_events(response.body(), done);
  ASSERT_GE(events.size(), 4u);
  const int prompt_tokens = events.back()["usage"]["prompt_tokens"];
  int previous = -1;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const Json& usage = events[i]["usage"];
    ASSERT_TRUE(usage.is_object()) << events[i].dump();
    EXPECT_EQ(usage["prompt_tokens"], prompt_tokens);
    EXPECT_GE(usage["completion_tokens"].get<int>(), previous);
    previous = usage["completion_tokens"];
    EXPECT_EQ(usage["total_tokens"], prompt_tokens + previous);
  }
  EXPECT_EQ(events.front()["usage"]["completion_tokens"], 0);  // the role chunk
  EXPECT_EQ(previous, 3);
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 3);
  // Without include_usage there is no usage at all (vLLM).
  auto plain = post("/v1/completions", R"({"prompt": "q", "stream": true,
      "stream_options": {"continuous_usage_stats": true}})");
  EXPECT_EQ(plain.body().find("usage"), std::string::npos) << plain.body();
}

// Chat echo: the last message's content comes first when it has the answer's role.
TEST_F(ApiServerTest, ChatEchoPrependsTheLastMessageOfTheAnswersRole) {
  start({"lo", " there"});
  const std::string messages = R"("messages": [{"role": "user", "content": "q"},
      {"role": "assistant", "content": "Hel"}], "chat_template_kwargs": {"enable_thinking": false})";
  auto whole = post("/v1/chat/completions",
                    "{" + messages + R"(, "echo": true, "add_generation_prompt": false,
                        "continue_final_message": true})");
  ASSERT_EQ(whole.result_int(), 200) << whole.body();
  EXPECT_EQ(Json::parse(whole.body())["choices"][0]["message"]["content"], "Hello there");
  auto streamed =
      post("/v1/chat/completions", "{" + messages + R"(, "echo": true, "stream": true})");
  ASSERT_EQ(streamed.result_int(), 200) << streamed.body();
  bool done = false;
  std::string content;
  for (const Json& event : sse_events(streamed.body(), done)) {
    if (!event["choices"].empty() && event["choices"][0]["delta"].contains("content")) {
      content += event["choices"][0]["delta"]["content"];
    }
  }
  EXPECT_EQ(content, "Hello there");
  // The last message is the user's and a new assistant turn opens: nothing to echo.
  auto user_last = post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "q"}],
      "echo": true, "chat_template_kwargs": {"enable_thinking": false}})");
  EXPECT_EQ(Json::parse(user_last.body())["choices"][0]["message"]["content"], "lo there");
}

}  // namespace
}  // namespace pdserve::api_test
