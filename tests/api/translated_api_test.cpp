// The Responses and Messages translations (common/api) on their own: request translation and
// its 400s, SSE framing split at every byte, and the event sequences made from a chat stream
// written as the serving node writes it (role chunk, reasoning, content, tool-call header and
// argument pieces, finish chunk, usage chunk, [DONE]) through a TranslatingChannel. The
// end-to-end checks with the official clients are tests/conformance/responses_messages_test.py.
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/api/anthropic_answer.h"
#include "common/api/anthropic_request.h"
#include "common/api/responses_answer.h"
#include "common/api/responses_request.h"
#include "common/api/sse_framing.h"
#include "common/api/translating_channel.h"

namespace pdserve::api {
namespace {

using Json = nlohmann::json;

// Records what the translated answer sends the client.
class RecordingChannel final : public http::ResponseChannel {
 public:
  void send(http::HttpResponse response) override { whole = std::move(response); }
  void start_stream(int status, std::string, http::HeaderList) override { stream_status = status; }
  bool write(std::string data) override {
    written += data;
    return true;
  }
  void end_stream() override { ended = true; }
  void on_cancel(std::function<void()>) override {}
  bool cancelled() const override { return false; }
  void post(std::function<void()> fn) override { fn(); }

  std::optional<http::HttpResponse> whole;
  int stream_status = 0;
  std::string written;
  bool ended = false;
};

std::string chat_event(const Json& chunk) {
  return "data: " + chunk.dump() + "\n\n";
}

Json chunk_with(const Json& delta, const Json& finish = nullptr) {
  return {{"id", "chatcmpl-abc"},
          {"object", "chat.completion.chunk"},
          {"created", 7},
          {"model", "m"},
          {"choices", Json::array({{{"index", 0}, {"delta", delta}, {"finish_reason", finish}}})}};
}

// A chat stream with reasoning, text and two tool calls, as GenerationStream writes it.
std::vector<std::string> tool_call_stream() {
  Json usage_chunk = {{"id", "chatcmpl-abc"},
                      {"created", 7},
                      {"model", "m"},
                      {"choices", Json::array()},
                      {"usage", {{"prompt_tokens", 11}, {"completion_tokens", 20}}}};
  return {
      ": pdserve_resume {\"id\":\"chatcmpl-abc\"}\n\n",
      chat_event(chunk_with({{"role", "assistant"}, {"content", ""}})),
      chat_event(chunk_with({{"reasoning_content", "think"}})),
      chat_event(chunk_with({{"content", "Hi."}})),
      chat_event(
          chunk_with({{"tool_calls",
                       Json::array({{{"index", 0},
                                     {"id", "call_abc_0_0"},
                                     {"type", "function"},
                                     {"function", {{"name", "f"}, {"arguments", "{\"a\""}}}}})}})),
      chat_event(chunk_with(
          {{"tool_calls", Json::array({{{"index", 0}, {"function", {{"arguments", ": 1}"}}}}})}})),
      chat_event(chunk_with(
          {{"tool_calls", Json::array({{{"index", 1},
                                        {"id", "call_abc_0_1"},
                                        {"type", "function"},
                                        {"function", {{"name", "g"}, {"arguments", "{}"}}}}})}})),
      chat_event(chunk_with(Json::object(), "tool_calls")),
      chat_event(usage_chunk),
      "data: [DONE]\n\n"};
}

// The stream's bytes fed one byte at a time: framing must not depend on how reads split it.
std::vector<std::pair<std::string, Json>> translate_bytewise(
    std::unique_ptr<ChatAnswerTranslator> translator, const std::vector<std::string>& events) {
  auto client = std::make_shared<RecordingChannel>();
  TranslatingChannel channel(client, std::move(translator));
  channel.start_stream(200, "text/event-stream", {});
  for (const std::string& event : events) {
    for (char byte : event) channel.write(std::string(1, byte));
  }
  channel.end_stream();
  EXPECT_TRUE(client->ended);
  std::vector<std::pair<std::string, Json>> out;
  SseDataReader reader;
  size_t at = 0;
  for (const std::string& data : reader.feed(client->written)) {
    const size_t name = client->written.find("event: ", at) + 7;
    const size_t end = client->written.find('\n', name);
    out.emplace_back(client->written.substr(name, end - name), Json::parse(data));
    at = end;
  }
  return out;
}

std::vector<std::string> names(const std::vector<std::pair<std::string, Json>>& events) {
  std::vector<std::string> out;
  for (const auto& [name, data] : events) out.push_back(name);
  return out;
}

TEST(SseDataReader, FramesEventsSplitAnywhereAndSkipsComments) {
  const std::string stream =
      ": comment\n\ndata: a\r\n\r\nevent: x\ndata: b\ndata: c\n\ndata: [DONE]\n\n";
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    SseDataReader reader;
    std::vector<std::string> got = reader.feed(stream.substr(0, cut));
    for (std::string& more : reader.feed(stream.substr(cut))) got.push_back(std::move(more));
    EXPECT_EQ(got, (std::vector<std::string>{"a", "b\nc", "[DONE]"})) << "cut at " << cut;
  }
}

TEST(ResponsesRequest, TranslatesInputItemsToChatMessages) {
  const Json body = {
      {"model", "m"},
      {"instructions", "be brief"},
      {"max_output_tokens", 9},
      {"top_k", 3},
      {"text",
       {{"format", {{"type", "json_schema"}, {"name", "x"}, {"schema", {{"type", "object"}}}}}}},
      {"input",
       Json::array(
           {{{"role", "user"},
             {"content", Json::array({{{"type", "input_text"}, {"text", "a"}},
                                      {{"type", "input_text"}, {"text", "b"}}})}},
            {{"type", "function_call"}, {"call_id", "c1"}, {"name", "f"}, {"arguments", "{}"}},
            {{"type", "function_call"}, {"call_id", "c2"}, {"name", "g"}, {"arguments", "{}"}},
            {{"type", "function_call_output"}, {"call_id", "c1"}, {"output", "1"}},
            {{"type", "reasoning"}, {"summary", Json::array()}}})}};
  ApiResult<ResponsesRequest> translated = translate_responses_request(body.dump());
  ASSERT_TRUE(translated.ok()) << translated.error().message;
  const Json chat = Json::parse(translated->chat.dump());
  EXPECT_EQ(chat["messages"].size(), 4u);
  EXPECT_EQ(chat["messages"][0], (Json{{"role", "system"}, {"content", "be brief"}}));
  EXPECT_EQ(chat["messages"][1], (Json{{"role", "user"}, {"content", "ab"}}));
  EXPECT_EQ(chat["messages"][2]["tool_calls"].size(), 2u) << "consecutive calls join one message";
  EXPECT_EQ(chat["messages"][3]["tool_call_id"], "c1");
  EXPECT_EQ(chat["max_completion_tokens"], 9);
  EXPECT_EQ(chat["top_k"], 3) << "the chat path's extensions pass through";
  EXPECT_EQ(chat["response_format"]["json_schema"]["name"], "x");
  EXPECT_FALSE(translated->stream);
}

TEST(ResponsesRequest, RefusesWhatIsNotSupportedNamingTheField) {
  const std::vector<std::pair<Json, std::string>> cases = {
      {{{"model", "m"}, {"input", "x"}, {"store", true}}, "store"},
      {{{"model", "m"}, {"input", "x"}, {"previous_response_id", "resp_1"}},
       "previous_response_id"},
      {{{"model", "m"}, {"input", "x"}, {"n", 2}}, "n"},
      {{{"model", "m"}}, "input"},
      {{{"model", "m"}, {"input", Json::array()}}, "input"},
      {{{"model", "m"}, {"input", "x"}, {"tools", Json::array({{{"type", "web_search"}}})}},
       "tools[0].type"},
      {{{"model", "m"},
        {"input",
         Json::array({{{"role", "user"}, {"content", Json::array({{{"type", "input_image"}}})}}})}},
       "input[0].content[0].type"},
  };
  for (const auto& [body, param] : cases) {
    ApiResult<ResponsesRequest> translated = translate_responses_request(body.dump());
    ASSERT_FALSE(translated.ok()) << body.dump();
    EXPECT_EQ(translated.error().http_status, 400);
    EXPECT_EQ(translated.error().param, param) << body.dump();
  }
  EXPECT_EQ(responses_param("max_completion_tokens"), "max_output_tokens");
  EXPECT_EQ(responses_param("messages[2].content"), "input[2].content");
}

TEST(MessagesRequest, TranslatesBlocksToChatMessages) {
  const Json body = {
      {"model", "m"},
      {"max_tokens", 5},
      {"system", Json::array({{{"type", "text"}, {"text", "sys"}}})},
      {"stop_sequences", Json::array({"END"})},
      {"tools", Json::array({{{"name", "f"}, {"input_schema", {{"type", "object"}}}}})},
      {"tool_choice", {{"type", "any"}}},
      {"messages",
       Json::array(
           {{{"role", "user"}, {"content", "q"}},
            {{"role", "assistant"},
             {"content",
              Json::array(
                  {{{"type", "thinking"}, {"thinking", "hm"}},
                   {{"type", "text"}, {"text", "ok"}},
                   {{"type", "tool_use"}, {"id", "t1"}, {"name", "f"}, {"input", {{"a", 1}}}}})}},
            {{"role", "user"},
             {"content",
              Json::array({{{"type", "text"}, {"text", "and?"}},
                           {{"type", "tool_result"},
                            {"tool_use_id", "t1"},
                            {"content", Json::array({{{"type", "text"}, {"text", "r"}}})}}})}}})}};
  ApiResult<MessagesRequest> translated =
      translate_messages_request(body.dump(), MessagesEndpoint::kCreate);
  ASSERT_TRUE(translated.ok()) << translated.error().message;
  const Json chat = Json::parse(translated->chat.dump());
  const Json& messages = chat["messages"];
  ASSERT_EQ(messages.size(), 5u);
  EXPECT_EQ(messages[0], (Json{{"role", "system"}, {"content", "sys"}}));
  EXPECT_EQ(messages[2]["content"], "ok");
  EXPECT_EQ(messages[2]["reasoning_content"], "hm");
  EXPECT_EQ(Json::parse(messages[2]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            (Json{{"a", 1}}));
  EXPECT_EQ(messages[3], (Json{{"role", "tool"}, {"tool_call_id", "t1"}, {"content", "r"}}))
      << "a tool result comes before the user's text";
  EXPECT_EQ(messages[4], (Json{{"role", "user"}, {"content", "and?"}}));
  EXPECT_EQ(chat["tools"][0]["function"]["parameters"], (Json{{"type", "object"}}));
  EXPECT_EQ(chat["tool_choice"], "required");
  EXPECT_EQ(chat["stop"], Json::array({"END"}));
  EXPECT_EQ(chat["max_completion_tokens"], 5);
}

TEST(MessagesRequest, MaxTokensIsRequiredExceptForCountTokens) {
  const Json body = {{"model", "m"},
                     {"messages", Json::array({{{"role", "user"}, {"content", "q"}}})}};
  ApiResult<MessagesRequest> create =
      translate_messages_request(body.dump(), MessagesEndpoint::kCreate);
  ASSERT_FALSE(create.ok());
  EXPECT_EQ(create.error().param, "max_tokens");
  EXPECT_TRUE(translate_messages_request(body.dump(), MessagesEndpoint::kCountTokens).ok());
  Json image = body;
  image["max_tokens"] = 3;
  image["messages"][0]["content"] = Json::array({{{"type", "image"}}});
  ApiResult<MessagesRequest> refused =
      translate_messages_request(image.dump(), MessagesEndpoint::kCreate);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().param, "messages[0].content[0].type");
}

TEST(AnthropicAnswer, AChatStreamBecomesAnthropicsEventSequence) {
  const auto events = translate_bytewise(std::make_unique<AnthropicAnswer>(), tool_call_stream());
  EXPECT_EQ(
      names(events),
      (std::vector<std::string>{
          "message_start", "content_block_start", "content_block_delta", "content_block_stop",
          "content_block_start", "content_block_delta", "content_block_stop", "content_block_start",
          "content_block_delta", "content_block_delta", "content_block_stop", "content_block_start",
          "content_block_delta", "content_block_stop", "message_delta", "message_stop"}));
  EXPECT_EQ(events[0].second["message"]["id"], "msg_abc");
  EXPECT_EQ(events[1].second["content_block"]["type"], "thinking");
  EXPECT_EQ(events[4].second["content_block"]["type"], "text");
  EXPECT_EQ(
      events[7].second["content_block"],
      (Json{
          {"type", "tool_use"}, {"id", "call_abc_0_0"}, {"name", "f"}, {"input", Json::object()}}));
  EXPECT_EQ(events[8].second["delta"]["partial_json"].get<std::string>() +
                events[9].second["delta"]["partial_json"].get<std::string>(),
            "{\"a\": 1}");
  EXPECT_EQ(events[11].second["index"], 3);
  EXPECT_EQ(events[14].second["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(events[14].second["usage"], (Json{{"input_tokens", 11}, {"output_tokens", 20}}));
}

TEST(ResponsesAnswer, AChatStreamBecomesTypedEventsWithSequenceNumbers) {
  const auto events = translate_bytewise(
      std::make_unique<ResponsesAnswer>(nlohmann::ordered_json::object()), tool_call_stream());
  EXPECT_EQ(names(events), (std::vector<std::string>{"response.created",
                                                     "response.in_progress",
                                                     "response.output_item.added",
                                                     "response.reasoning_text.delta",
                                                     "response.reasoning_text.done",
                                                     "response.output_item.done",
                                                     "response.output_item.added",
                                                     "response.content_part.added",
                                                     "response.output_text.delta",
                                                     "response.output_text.done",
                                                     "response.content_part.done",
                                                     "response.output_item.done",
                                                     "response.output_item.added",
                                                     "response.function_call_arguments.delta",
                                                     "response.function_call_arguments.delta",
                                                     "response.function_call_arguments.done",
                                                     "response.output_item.done",
                                                     "response.output_item.added",
                                                     "response.function_call_arguments.delta",
                                                     "response.function_call_arguments.done",
                                                     "response.output_item.done",
                                                     "response.completed"}));
  for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i].second["sequence_number"], i);
  const Json& response = events.back().second["response"];
  EXPECT_EQ(response["id"], "resp_abc");
  EXPECT_EQ(response["status"], "completed");
  ASSERT_EQ(response["output"].size(), 4u);
  EXPECT_EQ(response["output"][2]["arguments"], "{\"a\": 1}");
  EXPECT_EQ(response["output"][2]["call_id"], "call_abc_0_0");
  EXPECT_EQ(response["usage"]["total_tokens"], 31);
}

TEST(ResponsesAnswer, AFailedStreamEndsWithResponseFailed) {
  std::vector<std::string> stream = tool_call_stream();
  stream.resize(3);
  stream.push_back(
      "data: {\"error\":{\"message\":\"node "
      "lost\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n");
  stream.push_back("data: [DONE]\n\n");
  const auto events = translate_bytewise(
      std::make_unique<ResponsesAnswer>(nlohmann::ordered_json::object()), stream);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().first, "response.failed");
  EXPECT_EQ(events.back().second["response"]["error"]["message"], "node lost");
  const auto anthropic = translate_bytewise(std::make_unique<AnthropicAnswer>(), stream);
  EXPECT_EQ(anthropic.back().first, "error");
  EXPECT_EQ(anthropic.back().second["error"]["type"], "api_error");
}

// What the chat path never writes (a chunk of the wrong shape, text that is not JSON, a stream
// without [DONE]) still ends the client's stream with an error event, never an exception.
TEST(TranslatingChannel, AnUnreadableChatStreamEndsWithAnErrorEvent) {
  for (const std::string& bad : {std::string("data: {\"choices\": 5}\n\n"),
                                 std::string("data: {\"choices\": [{\"delta\": 3}]}\n\n"),
                                 std::string("data: not json\n\n"), std::string()}) {
    std::vector<std::string> stream = tool_call_stream();
    stream.resize(3);
    if (!bad.empty()) stream.push_back(bad);
    const auto responses = translate_bytewise(
        std::make_unique<ResponsesAnswer>(nlohmann::ordered_json::object()), stream);
    EXPECT_EQ(responses.back().first, "response.failed") << bad;
    const auto anthropic = translate_bytewise(std::make_unique<AnthropicAnswer>(), stream);
    EXPECT_EQ(anthropic.back().first, "error") << bad;
  }
}

TEST(TranslatingChannel, ErrorsTakeTheApisShape) {
  auto client = std::make_shared<RecordingChannel>();
  TranslatingChannel channel(client, std::make_unique<AnthropicAnswer>());
  channel.send(
      {404,
       "application/json",
       {},
       R"({"error":{"message":"The model 'x' does not exist.","type":"invalid_request_error","param":"model","code":"model_not_found"}})"});
  ASSERT_TRUE(client->whole);
  EXPECT_EQ(client->whole->status, 404);
  const Json body = Json::parse(client->whole->body);
  EXPECT_EQ(body["type"], "error");
  EXPECT_EQ(body["error"]["type"], "not_found_error");
  EXPECT_EQ(body["error"]["message"], "The model 'x' does not exist.")
      << "it names the field already";

  auto bad_client = std::make_shared<RecordingChannel>();
  TranslatingChannel bad(bad_client, std::make_unique<AnthropicAnswer>());
  bad.send(
      {400,
       "application/json",
       {},
       R"({"error":{"message":"too large","type":"invalid_request_error","param":"max_completion_tokens","code":null}})"});
  EXPECT_EQ(Json::parse(bad_client->whole->body)["error"]["message"], "max_tokens: too large")
      << "the Messages API's name of the field";

  auto responses_client = std::make_shared<RecordingChannel>();
  TranslatingChannel responses(responses_client,
                               std::make_unique<ResponsesAnswer>(nlohmann::ordered_json::object()));
  responses.send(
      {400,
       "application/json",
       {},
       R"({"error":{"message":"too large","type":"invalid_request_error","param":"max_completion_tokens","code":null}})"});
  EXPECT_EQ(Json::parse(responses_client->whole->body)["error"]["param"], "max_output_tokens");
}

TEST(ResponsesAnswer, AWholeChatCompletionBecomesTheResponseObject) {
  const Json completion = {
      {"id", "chatcmpl-xyz"},
      {"created", 3},
      {"model", "m"},
      {"choices",
       Json::array(
           {{{"index", 0},
             {"message", {{"role", "assistant"}, {"content", "text"}, {"reasoning_content", "r"}}},
             {"finish_reason", "length"}}})},
      {"usage", {{"prompt_tokens", 4}, {"completion_tokens", 5}}}};
  auto client = std::make_shared<RecordingChannel>();
  TranslatingChannel channel(client,
                             std::make_unique<ResponsesAnswer>(nlohmann::ordered_json::object()));
  channel.send({200, "application/json", {}, completion.dump()});
  const Json response = Json::parse(client->whole->body);
  EXPECT_EQ(response["status"], "incomplete");
  EXPECT_EQ(response["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(response["output"][0]["type"], "reasoning");
  EXPECT_EQ(response["output"][1]["content"][0]["text"], "text");
  EXPECT_EQ(response["usage"]["input_tokens"], 4);
}

}  // namespace
}  // namespace pdserve::api
