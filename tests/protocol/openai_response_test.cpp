#include "common/protocol/openai_response.h"

#include <cmath>

#include <gtest/gtest.h>

namespace pdserve {
namespace {

const ResponseMeta kMeta{"cmpl-1", 1700000000, "qwen3"};

TEST(CompletionResponse, MatchesTheOpenAiShape) {
  CompletionChoice first{0, "Hello", std::nullopt, 0, FinishReason::kStop, std::nullopt};
  CompletionChoice second{1, " world", std::nullopt, 0, FinishReason::kLength, std::nullopt};
  EXPECT_EQ(to_json_text(completion_response(kMeta, {first, second}, {5, 7})),
            R"({"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"qwen3",)"
            R"("choices":[{"index":0,"text":"Hello","logprobs":null,"finish_reason":"stop"},)"
            R"({"index":1,"text":" world","logprobs":null,"finish_reason":"length"}],)"
            R"("usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}})");
}

TEST(CompletionResponse, LogprobsWithEchoAndNegativeInfinity) {
  // Echo: the first prompt token has no logprob; -inf becomes -9999.0; text_offset counts code
  // points ("é" is one).
  std::vector<OutputTokenLogprob> tokens = {
      {"Hi", std::nullopt, {}},
      {" é", -0.5f, {{" é", -0.5f}, {" e", -1.25f}}},
      {"!", -INFINITY, {{"!", -INFINITY}}},
  };
  CompletionChoice choice{0, "Hi é!", tokens, 0, FinishReason::kLength, std::nullopt};
  EXPECT_EQ(to_json_text(completion_response(kMeta, {choice}, {1, 2})["choices"][0]["logprobs"]),
            R"({"tokens":["Hi"," é","!"],"token_logprobs":[null,-0.5,-9999.0],)"
            R"("top_logprobs":[null,{" é":-0.5," e":-1.25},{"!":-9999.0}],)"
            R"("text_offset":[0,2,4]})");
  // A stream chunk continues the offsets from the text already sent.
  EXPECT_EQ(to_json_text(completion_logprobs_json({{"ab", -1.0f, {}}}, 10)["text_offset"]), "[10]");
  // NaN never reaches the JSON either.
  EXPECT_EQ(to_json_text(completion_logprobs_json({{"a", NAN, {}}}, 0)["token_logprobs"]),
            "[-9999.0]");
}

TEST(ChatResponse, MessageWithReasoningAndWithout) {
  ChatChoice thinking{0, "4", std::string("2+2=4"), std::nullopt, FinishReason::kStop, {}, {}};
  ChatChoice plain{1, "Four.", std::nullopt, std::nullopt, FinishReason::kLength, {}, {}};
  ResponseMeta meta{"chatcmpl-9", 1, "m"};
  EXPECT_EQ(
      to_json_text(chat_completion_response(meta, {thinking, plain}, {10, 3})),
      R"({"id":"chatcmpl-9","object":"chat.completion","created":1,"model":"m","choices":[)"
      R"({"index":0,"message":{"role":"assistant","content":"4","reasoning_content":"2+2=4"},)"
      R"("logprobs":null,"finish_reason":"stop"},)"
      R"({"index":1,"message":{"role":"assistant","content":"Four."},"logprobs":null,)"
      R"("finish_reason":"length"}],"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}})");
}

// vLLM's stop_reason: the stop string that ended a choice, whole and in the finish chunk;
// absent when none did (EOS, length).
TEST(ChatResponse, AMatchedStopStringIsTheStopReason) {
  ChatChoice stopped{0, "Sunny, then ", std::nullopt, std::nullopt, FinishReason::kStop, {}, "RAIN"};
  const auto body = chat_completion_response({"chatcmpl-s", 1, "m"}, {stopped}, {});
  EXPECT_EQ(body["choices"][0]["stop_reason"], "RAIN");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  const auto chunk = chat_finish_chunk({"chatcmpl-s", 1, "m"}, {}, 0, FinishReason::kStop, false, "RAIN");
  EXPECT_EQ(chunk["choices"][0]["stop_reason"], "RAIN");
  const auto plain = chat_finish_chunk({"chatcmpl-s", 1, "m"}, {}, 0, FinishReason::kStop);
  EXPECT_FALSE(plain["choices"][0].contains("stop_reason"));
}

TEST(ChatResponse, ToolCallsMakeTheFinishReasonAndANullEmptyContent) {
  const std::vector<ChatToolCall> calls = {{"call_a_0_0", "get_weather", R"({"city": "Oslo"})"},
                                           {"call_a_0_1", "now", "{}"}};
  ChatChoice only_calls{0, "", std::nullopt, std::nullopt, FinishReason::kStop, calls, {}};
  ChatChoice with_text{1,         "Let me look.", std::nullopt, std::nullopt, FinishReason::kLength,
                       {calls[1]}, {}};
  const auto body = chat_completion_response({"chatcmpl-a", 1, "m"}, {only_calls, with_text}, {});
  EXPECT_EQ(to_json_text(body["choices"][0]),
            R"({"index":0,"message":{"role":"assistant","content":null,"tool_calls":[)"
            R"({"id":"call_a_0_0","type":"function","function":{"name":"get_weather",)"
            R"("arguments":"{\"city\": \"Oslo\"}"}},)"
            R"({"id":"call_a_0_1","type":"function","function":{"name":"now","arguments":"{}"}}]},)"
            R"("logprobs":null,"finish_reason":"tool_calls"})");
  EXPECT_EQ(body["choices"][1]["message"]["content"], "Let me look.");
  // Cut by max_tokens: "length" even after calls, so that a client can tell (OpenAI's rule).
  EXPECT_EQ(body["choices"][1]["finish_reason"], "length");

  // Streamed: a call's first entry has its id, type and name, the next ones only arguments;
  // the finish chunk says tool_calls.
  const std::vector<ChatToolCallDelta> parts = {
      {0, ChatToolCallDelta::Header{"call_a_0_0", "get_weather"}, R"({"city": "Os)"},
      {1, ChatToolCallDelta::Header{"call_a_0_1", "now"}, ""}};
  const auto chunk = chat_delta_chunk({"chatcmpl-a", 1, "m"}, {}, 0, "", "Sure.", nullptr, parts);
  EXPECT_EQ(to_json_text(chunk["choices"][0]["delta"]),
            R"({"content":"Sure.","tool_calls":[{"index":0,"id":"call_a_0_0","type":"function",)"
            R"("function":{"name":"get_weather","arguments":"{\"city\": \"Os"}},)"
            R"({"index":1,"id":"call_a_0_1","type":"function",)"
            R"("function":{"name":"now","arguments":""}}]})");
  const auto next = chat_delta_chunk({"chatcmpl-a", 1, "m"}, {}, 0, "", "", nullptr,
                                     {{0, std::nullopt, R"(lo"})"}, {1, std::nullopt, "{}"}});
  EXPECT_EQ(to_json_text(next["choices"][0]["delta"]),
            R"({"tool_calls":[{"index":0,"function":{"arguments":"lo\"}"}},)"
            R"({"index":1,"function":{"arguments":"{}"}}]})");
  EXPECT_EQ(chat_finish_chunk({"c", 0, "m"}, {}, 0, FinishReason::kStop,
                              true)["choices"][0]["finish_reason"],
            "tool_calls");
  EXPECT_EQ(
      chat_finish_chunk({"c", 0, "m"}, {}, 0, FinishReason::kStop)["choices"][0]["finish_reason"],
      "stop");
}

TEST(ChatResponse, LogprobsCarryBytesAndSpellPartialUtf8) {
  // "\xe4\xbd" is the first two bytes of "你": not valid UTF-8 on its own.
  std::vector<OutputTokenLogprob> tokens = {
      {"Hi", -0.25f, {{"Hi", -0.25f}, {"Hello", -2.0f}}},
      {"\xe4\xbd", -1.0f, {}},
  };
  EXPECT_EQ(to_json_text(chat_logprobs_json(tokens)),
            R"({"content":[{"token":"Hi","logprob":-0.25,"bytes":[72,105],"top_logprobs":[)"
            R"({"token":"Hi","logprob":-0.25,"bytes":[72,105]},)"
            R"({"token":"Hello","logprob":-2.0,"bytes":[72,101,108,108,111]}]},)"
            R"({"token":"bytes:\\xe4\\xbd","logprob":-1.0,"bytes":[228,189],"top_logprobs":[]}]})");
}

TEST(Sse, Framing) {
  EXPECT_EQ(sse_event(nlohmann::ordered_json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  // Invalid UTF-8 in a payload is replaced, never thrown.
  EXPECT_EQ(sse_event(nlohmann::ordered_json{{"t", "a\xff"}}),
            "data: {\"t\":\"a\xEF\xBF\xBD\"}\n\n");
}

TEST(Sse, ChatStreamSequence) {
  ResponseMeta meta{"chatcmpl-1", 5, "m"};
  StreamOptions options{true};
  std::string stream = sse_event(chat_role_chunk(meta, options, 0)) +
                       sse_event(chat_delta_chunk(meta, options, 0, "hmm", "", nullptr)) +
                       sse_event(chat_delta_chunk(meta, options, 0, "", "Hi", nullptr)) +
                       sse_event(chat_finish_chunk(meta, options, 0, FinishReason::kStop)) +
                       sse_event(usage_chunk(meta, true, {4, 2})) + sse_done();
  const std::string head =
      R"("id":"chatcmpl-1","object":"chat.completion.chunk","created":5,"model":"m")";
  EXPECT_EQ(
      stream,
      "data: {" + head +
          R"(,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null})"
          "\n\n"
          "data: {" +
          head +
          R"(,"choices":[{"index":0,"delta":{"reasoning_content":"hmm"},"logprobs":null,"finish_reason":null}],"usage":null})"
          "\n\n"
          "data: {" +
          head +
          R"(,"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}],"usage":null})"
          "\n\n"
          "data: {" +
          head +
          R"(,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null})"
          "\n\n"
          "data: {" +
          head +
          R"(,"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}})"
          "\n\n"
          "data: [DONE]\n\n");
}

TEST(Sse, ChunksWithoutIncludeUsageHaveNoUsageField) {
  ResponseMeta meta{"c", 0, "m"};
  auto chunk = chat_role_chunk(meta, {}, 2);
  EXPECT_FALSE(chunk.contains("usage"));
  EXPECT_EQ(chunk["choices"][0]["index"], 2);
  std::vector<OutputTokenLogprob> logprobs = {{"Hi", -0.5f, {}}};
  auto with_logprobs = chat_delta_chunk(meta, {}, 0, "", "Hi", &logprobs);
  EXPECT_EQ(to_json_text(with_logprobs["choices"][0]["logprobs"]),
            R"({"content":[{"token":"Hi","logprob":-0.5,"bytes":[72,105],"top_logprobs":[]}]})");
}

TEST(Sse, CompletionChunks) {
  CompletionChoice piece{1, "ab", std::nullopt, 0, FinishReason::kNone, std::nullopt};
  EXPECT_EQ(to_json_text(completion_chunk(kMeta, {}, piece)),
            R"({"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"qwen3",)"
            R"("choices":[{"index":1,"text":"ab","logprobs":null,"finish_reason":null}]})");
  CompletionChoice last{1, "", std::nullopt, 0, FinishReason::kLength, std::nullopt};
  EXPECT_EQ(
      to_json_text(completion_chunk(kMeta, {true}, last)),
      R"({"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"qwen3",)"
      R"("choices":[{"index":1,"text":"","logprobs":null,"finish_reason":"length"}],"usage":null})");
  EXPECT_EQ(to_json_text(usage_chunk(kMeta, false, {3, 4})),
            R"({"id":"cmpl-1","object":"text_completion","created":1700000000,"model":"qwen3",)"
            R"("choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}})");
}

// vLLM's prompt_logprobs: null for the first prompt token, then id -> {logprob, rank,
// decoded_token}; a -inf logprob is written as -9999.0 (JSON has no -inf).
TEST(CompletionResponse, PromptLogprobsInVllmsShape) {
  CompletionChoice choice{0, "x", std::nullopt, 0, FinishReason::kLength, std::nullopt};
  choice.prompt_logprobs = std::vector<PromptPositionLogprobs>{
      {{{7, -1.5f, 4, "a"}, {3, -0.25f, 1, "b"}}}, {{{9, -INFINITY, 151936, "c"}}}};
  const nlohmann::ordered_json body = completion_response({"cmpl-1", 1, "m"}, {choice}, {});
  EXPECT_EQ(body["choices"][0]["prompt_logprobs"].dump(),
            R"([null,{"7":{"logprob":-1.5,"rank":4,"decoded_token":"a"},)"
            R"("3":{"logprob":-0.25,"rank":1,"decoded_token":"b"}},)"
            R"({"9":{"logprob":-9999.0,"rank":151936,"decoded_token":"c"}}])");
  choice.prompt_logprobs.reset();
  EXPECT_FALSE(completion_response({"cmpl-1", 1, "m"}, {choice}, {})["choices"][0].contains(
      "prompt_logprobs"));
}

}  // namespace
}  // namespace pdserve
