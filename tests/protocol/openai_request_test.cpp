#include "common/protocol/openai_request.h"

#include <string>

#include <gtest/gtest.h>

namespace pdserve {
namespace {

using Json = nlohmann::ordered_json;
constexpr int kVocab = 1000;

GenerationRequest completion(const std::string& body) {
  auto result = parse_completion_request(Json::parse(body), kVocab);
  if (!result.ok()) {
    ADD_FAILURE() << body << " -> " << result.error().message;
    return {};
  }
  return std::move(result).value();
}

GenerationRequest chat(const std::string& body) {
  auto result = parse_chat_completion_request(Json::parse(body), kVocab);
  if (!result.ok()) {
    ADD_FAILURE() << body << " -> " << result.error().message;
    return {};
  }
  return std::move(result).value();
}

struct ErrorCase {
  std::string body;
  std::string param;    // "" for none
  std::string message;  // a substring of the message
};

void expect_error(const ApiResult<GenerationRequest>& result, const ErrorCase& c) {
  ASSERT_FALSE(result.ok()) << c.body;
  const ApiError& error = result.error();
  EXPECT_EQ(error.http_status, 400) << c.body;
  EXPECT_EQ(error.type, "invalid_request_error");
  EXPECT_EQ(error.param.value_or(""), c.param) << c.body << " -> " << error.message;
  EXPECT_NE(error.message.find(c.message), std::string::npos)
      << c.body << " -> " << error.message << " (expected to contain: " << c.message << ")";
}

// ---- JSON body -------------------------------------------------------------------------------

TEST(ParseJsonBody, AcceptsAnObject) {
  auto body = parse_json_body(R"({"b": 1, "a": [1, {"c": "[[[["}]})");
  ASSERT_TRUE(body.ok());
  EXPECT_EQ(body->begin().key(), "b");  // client order kept
}

TEST(ParseJsonBody, MalformedJsonNamesTheByte) {
  auto body = parse_json_body(R"({"prompt": "x",})");
  ASSERT_FALSE(body.ok());
  EXPECT_EQ(body.error().http_status, 400);
  EXPECT_NE(body.error().message.find("invalid JSON at byte 16"), std::string::npos)
      << body.error().message;
  EXPECT_FALSE(parse_json_body("").ok());
  EXPECT_FALSE(parse_json_body("{\"a\": \"\xff\"}").ok());  // invalid UTF-8 in a string
  EXPECT_FALSE(parse_json_body(R"({"n": 1e400})").ok());    // number overflow
}

TEST(ParseJsonBody, RejectsNonObjectsAndDeepNesting) {
  auto array = parse_json_body("[1, 2]");
  ASSERT_FALSE(array.ok());
  EXPECT_NE(array.error().message.find("must be a JSON object, got an array"), std::string::npos);
  std::string deep = "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  auto nested = parse_json_body(deep);
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(nested.error().message.find("deeper than 64 levels"), std::string::npos);
  // Brackets inside strings (with escaped quotes) do not count.
  std::string quoted = "{\"a\": \"\\\"" + std::string(1000, '[') + "\"}";
  EXPECT_TRUE(parse_json_body(quoted).ok());
}

// ---- /v1/completions -------------------------------------------------------------------------

TEST(CompletionRequest, PromptShapes) {
  GenerationRequest text = completion(R"({"prompt": "Hello"})");
  ASSERT_EQ(text.prompts.size(), 1u);
  EXPECT_FALSE(text.prompts[0].is_token_ids);
  EXPECT_EQ(text.prompts[0].text, "Hello");
  EXPECT_EQ(text.endpoint, ApiEndpoint::kCompletions);

  GenerationRequest texts = completion(R"({"prompt": ["a", "b", "c"]})");
  ASSERT_EQ(texts.prompts.size(), 3u);
  EXPECT_EQ(texts.prompts[2].text, "c");

  GenerationRequest ids = completion(R"({"prompt": [1, 2, 999]})");
  ASSERT_EQ(ids.prompts.size(), 1u);
  EXPECT_TRUE(ids.prompts[0].is_token_ids);
  EXPECT_EQ(ids.prompts[0].token_ids, (std::vector<int32_t>{1, 2, 999}));

  GenerationRequest id_lists = completion(R"({"prompt": [[0], [5, 6]]})");
  ASSERT_EQ(id_lists.prompts.size(), 2u);
  EXPECT_EQ(id_lists.prompts[1].token_ids, (std::vector<int32_t>{5, 6}));
}

TEST(CompletionRequest, DefaultsWhenOnlyThePromptIsGiven) {
  GenerationRequest r = completion(R"({"prompt": "x", "model": null, "temperature": null})");
  EXPECT_EQ(r.model, "");
  EXPECT_FALSE(r.max_tokens);
  EXPECT_FALSE(r.requested_defaults.temperature);
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.echo);
  EXPECT_FALSE(r.sampling.want_logprobs);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_TRUE(r.skip_special_tokens);
}

TEST(CompletionRequest, EveryFieldIsCarried) {
  GenerationRequest r = completion(R"({
    "model": "qwen3-0.6b", "prompt": "x", "max_tokens": 32, "min_tokens": 4,
    "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05,
    "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
    "seed": 42, "stop": ["\n\n", "END"], "stop_token_ids": [7, 8], "ignore_eos": true,
    "logprobs": 5, "echo": true, "n": 3, "stream": true,
    "stream_options": {"include_usage": true}, "user": "u1",
    "include_stop_str_in_output": true, "skip_special_tokens": false,
    "best_of": 1, "suffix": null, "logit_bias": {}})");
  EXPECT_EQ(r.model, "qwen3-0.6b");
  EXPECT_EQ(r.max_tokens, 32);
  EXPECT_EQ(r.sampling.min_tokens, 4);
  EXPECT_FLOAT_EQ(*r.requested_defaults.temperature, 0.7f);
  EXPECT_FLOAT_EQ(*r.requested_defaults.top_p, 0.9f);
  EXPECT_EQ(*r.requested_defaults.top_k, 20);
  EXPECT_FLOAT_EQ(*r.requested_defaults.min_p, 0.05f);
  EXPECT_FLOAT_EQ(*r.requested_defaults.repetition_penalty, 1.1f);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, -0.5f);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(r.sampling.stop_token_ids, (std::vector<int32_t>{7, 8}));
  EXPECT_TRUE(r.sampling.ignore_eos);
  EXPECT_TRUE(r.sampling.want_logprobs);
  EXPECT_EQ(r.sampling.logprobs, 5);
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.n, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.user, "u1");
  EXPECT_TRUE(r.include_stop_str_in_output);
  EXPECT_FALSE(r.skip_special_tokens);
}

TEST(CompletionRequest, ScalarVariants) {
  EXPECT_EQ(completion(R"({"prompt": "x", "stop": "###"})").stop,
            (std::vector<std::string>{"###"}));
  EXPECT_EQ(completion(R"({"prompt": "x", "logprobs": 0})").sampling.want_logprobs, true);
  // Integers are numbers too; seeds may be negative (taken modulo 2^64) or above 2^63.
  EXPECT_FLOAT_EQ(
      *completion(R"({"prompt": "x", "temperature": 1})").requested_defaults.temperature, 1.0f);
  EXPECT_EQ(completion(R"({"prompt": "x", "seed": -1})").sampling.seed, UINT64_MAX);
  EXPECT_EQ(completion(R"({"prompt": "x", "seed": 18446744073709551615})").sampling.seed,
            UINT64_MAX);
  EXPECT_EQ(completion(R"({"prompt": "x", "top_k": -1})").requested_defaults.top_k, -1);
  EXPECT_EQ(completion(R"({"prompt": "x", "stream": false, "stream_options": null})").stream,
            false);
}

TEST(CompletionRequest, Errors) {
  const ErrorCase cases[] = {
      {R"({})", "prompt", "Missing required parameter: 'prompt'."},
      {R"({"prompt": null})", "prompt", "Missing required parameter"},
      {R"({"prompt": ""})", "prompt", "the prompt is empty"},
      {R"({"prompt": []})", "prompt", "the list of prompts is empty"},
      {R"({"prompt": [[]]})", "prompt[0]", "the prompt is empty"},
      {R"({"prompt": ["a", ""]})", "prompt[1]", "the prompt is empty"},
      {R"({"prompt": 5})", "prompt", "Invalid type for 'prompt'"},
      {R"({"prompt": true})", "prompt", "but got a boolean instead"},
      {R"({"prompt": {"text": "x"}})", "prompt", "but got an object instead"},
      {R"({"prompt": ["a", 1]})", "prompt[1]", "expected a string, but got an integer"},
      {R"({"prompt": [1, "a"]})", "prompt[1]", "expected an integer token id"},
      {R"({"prompt": [[1], 2]})", "prompt[1]", "expected an array of token ids"},
      {R"({"prompt": [1, 1000]})", "prompt[1]",
       "token id 1000 is outside the vocabulary [0, 1000)"},
      {R"({"prompt": [[1, -1]]})", "prompt[0][1]", "token id -1 is outside"},
      {R"({"prompt": [18446744073709551615]})", "prompt[0]",
       "token id 18446744073709551615 is outside"},
      {R"({"prompt": "x", "n": 18446744073709551615})", "n", "out of range"},
      {R"({"prompt": [1.5]})", "prompt", "Invalid type for 'prompt'"},
      {R"({"prompt": [1, 2.5]})", "prompt[1]", "expected an integer token id"},
      {R"({"prompt": "x", "max_tokens": 0})", "max_tokens", "0 is out of range (allowed: >= 1)"},
      {R"({"prompt": "x", "max_tokens": -5})", "max_tokens", "out of range"},
      {R"({"prompt": "x", "max_tokens": 10000000000})", "max_tokens", "out of range"},
      {R"({"prompt": "x", "max_tokens": 99999999999999999999})", "max_tokens",
       "out of range"},  // beyond 64 bits: parsed as the integral float 1e20
      {R"({"prompt": "x", "max_tokens": 5.5})", "max_tokens",
       "expected an integer, but got a number instead"},
      {R"({"prompt": "x", "max_tokens": "5"})", "max_tokens", "but got a string instead"},
      {R"({"prompt": "x", "min_tokens": -1})", "min_tokens", "out of range"},
      {R"({"prompt": "x", "temperature": "0.5"})", "temperature",
       "Invalid type for 'temperature': expected a number, but got a string instead."},
      {R"({"prompt": "x", "temperature": -0.1})", "temperature",
       "-0.1 is out of range (allowed: a finite number >= 0)"},
      {R"({"prompt": "x", "temperature": true})", "temperature", "got a boolean"},
      {R"({"prompt": "x", "top_p": 0})", "top_p", "out of range (allowed: (0, 1])"},
      {R"({"prompt": "x", "top_p": 1.01})", "top_p", "out of range"},
      {R"({"prompt": "x", "top_k": -2})", "top_k", "out of range"},
      {R"({"prompt": "x", "top_k": 1.5})", "top_k", "expected an integer"},
      {R"({"prompt": "x", "min_p": 1.5})", "min_p", "out of range"},
      {R"({"prompt": "x", "presence_penalty": 2.5})", "presence_penalty", "[-2, 2]"},
      {R"({"prompt": "x", "frequency_penalty": -3})", "frequency_penalty", "[-2, 2]"},
      {R"({"prompt": "x", "repetition_penalty": 0})", "repetition_penalty", "> 0"},
      {R"({"prompt": "x", "repetition_penalty": -1})", "repetition_penalty", "out of range"},
      {R"({"prompt": "x", "seed": 1.5})", "seed", "expected an integer"},
      {R"({"prompt": "x", "seed": "1"})", "seed", "expected an integer"},
      {R"({"prompt": "x", "stop": 5})", "stop", "expected a string or an array of strings"},
      {R"({"prompt": "x", "stop": ""})", "stop", "must not be empty"},
      {R"({"prompt": "x", "stop": ["a", 1]})", "stop[1]", "expected a string"},
      {R"({"prompt": "x", "stop": ["a", ""]})", "stop[1]", "must not be empty"},
      {R"({"prompt": "x", "stop": ["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"]})",
       "stop", "at most 16 stop strings are allowed, got 17"},
      {R"({"prompt": "x", "stop_token_ids": 5})", "stop_token_ids", "expected an array"},
      {R"({"prompt": "x", "stop_token_ids": [1, 5000]})", "stop_token_ids[1]",
       "outside the vocabulary"},
      {R"({"prompt": "x", "ignore_eos": 1})", "ignore_eos", "expected a boolean"},
      {R"({"prompt": "x", "logprobs": 21})", "logprobs", "out of range (allowed: 0 to 20)"},
      {R"({"prompt": "x", "logprobs": -1})", "logprobs", "out of range"},
      {R"({"prompt": "x", "logprobs": true})", "logprobs", "expected an integer"},
      {R"({"prompt": "x", "echo": "yes"})", "echo", "expected a boolean"},
      {R"({"prompt": "x", "n": 0})", "n", "out of range (allowed: 1 to 128)"},
      {R"({"prompt": "x", "n": 129})", "n", "out of range"},
      {R"({"prompt": "x", "stream": "true"})", "stream", "expected a boolean"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options",
       "only allowed when 'stream' is enabled"},
      {R"({"prompt": "x", "stream": true, "stream_options": []})", "stream_options",
       "expected an object"},
      {R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": 1}})",
       "stream_options.include_usage", "expected a boolean"},
      {R"({"prompt": "x", "stream": true, "stream_options": {"usage": true}})",
       "stream_options.usage", "Unrecognized request argument supplied: stream_options.usage"},
      {R"({"prompt": "x", "user": 5})", "user", "expected a string"},
      {R"({"prompt": "x", "model": ["m"]})", "model", "expected a string"},
      {R"({"prompt": "x", "temprature": 0.5})", "temprature",
       "Unrecognized request argument supplied: temprature"},
      {R"({"prompt": "x", "messages": []})", "messages", "Unrecognized request argument"},
      {R"({"prompt": "x", "best_of": 2})", "best_of", "best_of is not supported"},
      {R"({"prompt": "x", "suffix": "end"})", "suffix", "'suffix' is not supported"},
      {R"({"prompt": "x", "logit_bias": [1]})", "logit_bias", "expected an object"},
      {R"({"prompt": "x", "logit_bias": {"1000": 1}})", "logit_bias",
       "not a token id in [0, 1000)"},
      {R"({"prompt": "x", "logit_bias": {"-1": 1}})", "logit_bias", "not a token id"},
      {R"({"prompt": "x", "logit_bias": {"abc": 1}})", "logit_bias", "not a token id"},
      {R"({"prompt": "x", "logit_bias": {"99999999999": 1}})", "logit_bias", "not a token id"},
      {R"({"prompt": "x", "logit_bias": {"5": 100.5}})", "logit_bias.5",
       "out of range (allowed: [-100, 100])"},
      {R"({"prompt": "x", "logit_bias": {"5": "high"}})", "logit_bias.5", "expected a number"},
      {R"({"prompt": "x", "store": 1})", "store", "expected a boolean"},
      {R"({"prompt": "x", "metadata": {"a": 1}})", "metadata.a", "expected a string"},
      {R"({"prompt": "x", "priority": 0.5})", "priority", "expected an integer"},
      {R"({"prompt": "x", "reasoning_effort": 1})", "reasoning_effort", "expected a string"},
      {R"({"prompt": "x", "stream": true, "stream_options": {"continuous_usage_stats": 1}})",
       "stream_options.continuous_usage_stats", "expected a boolean"},
  };
  for (const ErrorCase& c : cases) {
    expect_error(parse_completion_request(Json::parse(c.body), kVocab, /*strict_fields=*/true), c);
  }
}

// vLLM's default: unknown top-level fields are ignored (and logged by the server), so clients on
// newer SDKs keep working; unknown fields inside the request's objects stay errors.
TEST(CompletionRequest, UnknownTopLevelFieldsAreIgnoredUnlessStrict) {
  GenerationRequest request = completion(
      R"({"prompt": "x", "web_search": true, "metadata": {"a": "1"}, "temprature": 0.5})");
  EXPECT_EQ(request.ignored_fields, (std::vector<std::string>{"web_search", "temprature"}));
  EXPECT_FALSE(request.requested_defaults.temperature);
  expect_error(
      parse_completion_request(Json::parse(R"({"prompt": "x", "web_search": true})"), kVocab, true),
      {"", "web_search", "Unrecognized request argument supplied: web_search"});
  expect_error(parse_completion_request(
                   Json::parse(R"({"prompt": "x", "stream": true, "stream_options": {"usage": true}})"),
                   kVocab),
               {"", "stream_options.usage", "Unrecognized"});
}

// OpenAI fields that change nothing here are known: accepted even in strict mode, never logged.
TEST(CompletionRequest, KnownOpenAiFieldsAreAcceptedAndIgnored) {
  const std::string body = R"({"prompt": "x", "store": true, "metadata": {"k": "v"},
      "reasoning_effort": "low", "priority": -3, "service_tier": "auto", "user": "u"})";
  auto strict = parse_completion_request(Json::parse(body), kVocab, /*strict_fields=*/true);
  ASSERT_TRUE(strict.ok()) << strict.error().message;
  EXPECT_TRUE(strict.value().ignored_fields.empty());
  auto chat_strict = parse_chat_completion_request(
      Json::parse(R"({"messages": [{"role": "user", "content": "hi"}], "store": false,
          "parallel_tool_calls": true, "reasoning_effort": "high"})"),
      kVocab, /*strict_fields=*/true);
  ASSERT_TRUE(chat_strict.ok()) << chat_strict.error().message;
}

TEST(CompletionRequest, LogitBiasBecomesSamplingParams) {
  GenerationRequest r =
      completion(R"({"prompt": "x", "logit_bias": {"5": 100, "999": -100, "0": 0.5, "005": -1}})");
  EXPECT_EQ(r.sampling.logit_bias, (std::vector<LogitBias>{{999, -100.0f}, {0, 0.5f}, {5, -1.0f}}));
  EXPECT_TRUE(completion(R"({"prompt": "x", "logit_bias": {}})").sampling.logit_bias.empty());
  EXPECT_TRUE(completion(R"({"prompt": "x", "logit_bias": null})").sampling.logit_bias.empty());
}

TEST(CompletionRequest, ContinuousUsageStats) {
  GenerationRequest r = completion(R"({"prompt": "x", "stream": true,
      "stream_options": {"include_usage": true, "continuous_usage_stats": true}})");
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.continuous_usage_stats);
}

// JSON Schema's integer (and pydantic's lax mode): 16.0 is the integer 16; 16.5 is not.
TEST(CompletionRequest, IntegralNumbersAreIntegers) {
  GenerationRequest request = completion(
      R"({"prompt": [5.0, 7], "max_tokens": 16.0, "n": 2.0, "seed": -3.0, "stop_token_ids": [9.0]})");
  EXPECT_EQ(request.prompts[0].token_ids, (std::vector<int32_t>{5, 7}));
  EXPECT_EQ(request.max_tokens, 16);
  EXPECT_EQ(request.n, 2);
  EXPECT_EQ(request.sampling.seed, static_cast<uint64_t>(-3));
  EXPECT_EQ(request.sampling.stop_token_ids, (std::vector<int32_t>{9}));
  for (const ErrorCase& c : std::vector<ErrorCase>{
           {R"({"prompt": "x", "max_tokens": 16.5})", "max_tokens", "expected an integer"},
           {R"({"prompt": [5.5]})", "prompt", "expected a string, an array"},
           {R"({"prompt": [5, 7.25]})", "prompt[1]", "expected an integer token id"},
           {R"({"prompt": "x", "seed": 1e30})", "seed", "expected an integer"},
           {R"({"prompt": "x", "n": 1e300})", "n", "out of range"}}) {
    expect_error(parse_completion_request(Json::parse(c.body), kVocab), c);
  }
}

TEST(CompletionRequest, ABodyThatIsNotAnObjectIsAnErrorNotACrash) {
  auto result = parse_completion_request(Json::parse("[1]"), kVocab);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().http_status, 400);
  EXPECT_FALSE(result.error().param);
}

TEST(CompletionRequest, StopStringLengthLimit) {
  Json body = {{"prompt", "x"}, {"stop", std::string(kMaxStopStringBytes, 'a')}};
  EXPECT_TRUE(parse_completion_request(body, kVocab).ok());
  body["stop"] = std::string(kMaxStopStringBytes + 1, 'a');
  expect_error(parse_completion_request(body, kVocab), {"", "stop", "at most 1024 bytes"});
}

// ---- /v1/chat/completions --------------------------------------------------------------------

TEST(ChatRequest, MessagesAreNormalizedForTheTemplate) {
  GenerationRequest r = chat(R"({"model": "m", "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Line 1"}, {"type": "text", "text": "Line 2"}], "name": "bob"},
      {"role": "assistant", "content": null, "tool_calls": [
          {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "content": "42", "tool_call_id": "call_1"},
      {"role": "assistant", "content": "It is 42.", "reasoning_content": "The tool said 42."},
      {"role": "user", "content": "Thanks"}]})");
  EXPECT_EQ(r.endpoint, ApiEndpoint::kChatCompletions);
  EXPECT_EQ(r.messages.dump(),
            R"([{"role":"system","content":"Be brief."},)"
            R"({"role":"user","content":"Line 1\nLine 2","name":"bob"},)"
            R"({"role":"assistant","content":"","tool_calls":[{"id":"call_1","type":"function",)"
            R"("function":{"name":"f","arguments":{"x":1}}}]},)"
            R"({"role":"tool","content":"42","tool_call_id":"call_1"},)"
            R"({"role":"assistant","content":"It is 42.","reasoning_content":"The tool said 42."},)"
            R"({"role":"user","content":"Thanks"}])");
}

TEST(ChatRequest, ToolCallArgumentsThatHoldNoObjectStayStrings) {
  const auto arguments_for = [](const std::string& arguments) {
    nlohmann::ordered_json body = nlohmann::ordered_json::parse(
        R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": ""}}]}]})");
    body["messages"][1]["tool_calls"][0]["function"]["arguments"] = arguments;
    auto parsed = parse_chat_completion_request(body, kVocab);
    EXPECT_TRUE(parsed.ok());
    return parsed.value().messages[1]["tool_calls"][0]["function"]["arguments"];
  };
  // Key order and numbers as written: the template's tojson writes them back.
  EXPECT_EQ(arguments_for(R"({"z":1,"a":[2.5,null]})").dump(), R"({"z":1,"a":[2.5,null]})");
  for (const std::string kept : {"not json", "[1, 2]", "\"text\"", "{\"a\": ", ""}) {
    EXPECT_EQ(arguments_for(kept), kept);
  }
  EXPECT_EQ(arguments_for(std::string(80, '[') + std::string(80, ']')).get<std::string>().size(),
            160u);
}

TEST(ChatRequest, ToolsKeepTheClientsKeyOrder) {
  const std::string tools =
      R"([{"type":"function","function":{"name":"get_weather","description":"d",)"
      R"("parameters":{"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}},)"
      R"("required":["zeta"]}}}])";
  GenerationRequest r = chat(R"({"messages": [{"role": "user", "content": "hi"}], "tools": )" +
                             tools + R"(, "tool_choice": "auto", "parallel_tool_calls": false})");
  EXPECT_EQ(r.tools.dump(), tools);
  EXPECT_EQ(r.tool_choice, "auto");
  EXPECT_TRUE(r.parses_tool_calls());
  EXPECT_EQ(chat(R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "none"})")
                .tool_choice,
            "none");
  // Tool calls are parsed only with tools and a tool_choice other than "none".
  EXPECT_FALSE(chat(R"({"messages": [{"role": "user", "content": "hi"}], "tools": )" + tools +
                    R"(, "tool_choice": "none"})")
                   .parses_tool_calls());
  EXPECT_FALSE(chat(R"({"messages": [{"role": "user", "content": "hi"}], "tools": []})")
                   .parses_tool_calls());
  EXPECT_FALSE(chat(R"({"messages": [{"role": "user", "content": "hi"}]})").parses_tool_calls());
}

TEST(ChatRequest, SamplingLogprobsAndTemplateOptions) {
  GenerationRequest r = chat(R"({"messages": [{"role": "user", "content": "hi"}],
      "max_tokens": 10, "max_completion_tokens": 20, "logprobs": true, "top_logprobs": 3,
      "temperature": 0, "seed": 7, "stop": "x", "n": 2, "stream": true,
      "stream_options": {"include_usage": false},
      "chat_template_kwargs": {"enable_thinking": false, "custom": [1, 2]},
      "response_format": {"type": "text"}})");
  EXPECT_EQ(r.max_tokens, 20);  // max_completion_tokens wins
  EXPECT_TRUE(r.sampling.want_logprobs);
  EXPECT_EQ(r.sampling.logprobs, 3);
  EXPECT_FLOAT_EQ(*r.requested_defaults.temperature, 0.0f);
  EXPECT_EQ(r.sampling.seed, 7u);
  EXPECT_EQ(r.n, 2);
  EXPECT_FALSE(r.include_usage);
  EXPECT_FALSE(r.enable_thinking);
  EXPECT_EQ(r.chat_template_kwargs.dump(), R"({"enable_thinking":false,"custom":[1,2]})");

  GenerationRequest plain = chat(R"({"messages": [{"role": "user", "content": "hi"}]})");
  EXPECT_TRUE(plain.enable_thinking);
  EXPECT_FALSE(plain.sampling.want_logprobs);
  EXPECT_FALSE(plain.max_tokens);
  GenerationRequest only_logprobs =
      chat(R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true})");
  EXPECT_TRUE(only_logprobs.sampling.want_logprobs);
  EXPECT_EQ(only_logprobs.sampling.logprobs, 0);
}

TEST(ChatRequest, DeveloperIsSystemAndPromptShapeFields) {
  GenerationRequest r = chat(R"({"messages": [{"role": "developer", "content": "be terse"},
      {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}],
      "echo": true, "add_generation_prompt": false, "continue_final_message": true})");
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_TRUE(r.echo);
  EXPECT_FALSE(r.add_generation_prompt);
  EXPECT_TRUE(r.continue_final_message);
  GenerationRequest plain = chat(R"({"messages": [{"role": "user", "content": "hi"}]})");
  EXPECT_TRUE(plain.add_generation_prompt);
  EXPECT_FALSE(plain.continue_final_message);
  EXPECT_FALSE(plain.echo);
  // The template kwarg wins over the field, as in vLLM.
  GenerationRequest kwarg = chat(R"({"messages": [{"role": "user", "content": "hi"}],
      "add_generation_prompt": true, "chat_template_kwargs": {"add_generation_prompt": false}})");
  EXPECT_FALSE(kwarg.add_generation_prompt);
}

TEST(ChatRequest, Errors) {
  const std::string user = R"({"role": "user", "content": "hi"})";
  auto with = [&](const std::string& fields) {
    return R"({"messages": [)" + user + "], " + fields + "}";
  };
  const ErrorCase cases[] = {
      {R"({})", "messages", "Missing required parameter: 'messages'."},
      {R"({"messages": "hi"})", "messages", "expected an array, but got a string"},
      {R"({"messages": []})", "messages", "the list is empty"},
      {R"({"messages": ["hi"]})", "messages[0]", "expected an object"},
      {R"({"messages": [{"content": "hi"}]})", "messages[0].role", "Missing required parameter"},
      {R"({"messages": [{"role": 1, "content": "hi"}]})", "messages[0].role", "expected a string"},
      {R"({"messages": [{"role": "robot", "content": "hi"}]})", "messages[0].role",
       "(allowed: system, developer, user, assistant, tool)"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content",
       "Missing required parameter: 'messages[0].content'."},
      {R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content",
       "expected a string or an array of content parts"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})",
       "messages[0].content[0].type",
       "only \"text\" content parts are supported, got \"image_url\""},
      {R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})",
       "messages[0].content[0].text", "Missing required parameter"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]})",
       "messages[0].content[0].text", "expected a string"},
      {R"({"messages": [{"role": "user", "content": ["hi"]}]})", "messages[0].content[0]",
       "expected an object"},
      {R"({"messages": [{"role": "user", "content": "hi", "mood": "happy"}]})", "messages[0].mood",
       "Unrecognized request argument supplied: messages[0].mood"},
      {R"({"messages": [{"role": "user", "content": "hi", "tool_calls": []}]})",
       "messages[0].tool_calls", "Unrecognized"},
      {R"({"messages": [{"role": "assistant", "content": "", "tool_calls": {}}]})",
       "messages[0].tool_calls", "expected an array"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}]})",
       "messages[0].tool_calls[0].function.arguments", "Missing required parameter"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}}]}]})",
       "messages[0].tool_calls[0].function.arguments", "expected a string"},
      {R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "code", "function": {"name": "f", "arguments": ""}}]}]})",
       "messages[0].tool_calls[0].type", "expected \"function\""},
      {R"({"messages": [{"role": "assistant", "content": "a", "reasoning_content": 1}]})",
       "messages[0].reasoning_content", "expected a string"},
      {R"({"messages": [{"role": "tool", "content": "a", "tool_call_id": 1}]})",
       "messages[0].tool_call_id", "expected a string"},
      {with(R"("tools": {})"), "tools", "expected an array"},
      {with(R"("tools": [{"type": "function"}])"), "tools[0].function", "Missing required"},
      {with(R"("tools": [{"type": "retrieval", "function": {"name": "f"}}])"), "tools[0].type",
       "expected \"function\""},
      {with(R"("tools": [{"type": "function", "function": {"name": ""}}])"),
       "tools[0].function.name", "must not be empty"},
      {with(R"("tools": [{"type": "function", "function": {"name": "f", "parameters": []}}])"),
       "tools[0].function.parameters", "expected an object"},
      {with(R"("tools": [{"type": "function", "function": {"name": "f", "extra": 1}}])"),
       "tools[0].function.extra", "Unrecognized"},
      {with(R"("tool_choice": "required")"), "tool_choice", "needs 'tools'"},
      {with(R"("tool_choice": {"type": "function", "function": {"name": "f"}})"), "tool_choice",
       "needs 'tools'"},
      {with(R"("tools": [{"type": "function", "function": {"name": "f"}}],
               "tool_choice": {"type": "function", "function": {"name": "g"}})"),
       "tool_choice.function.name", "no tool is named \"g\""},
      {with(R"("tools": [{"type": "function", "function": {"name": "f", "parameters":
               {"type": "no such type"}}}], "tool_choice": "required")"),
       "tools", "Invalid value"},
      {with(R"("tools": [{"type": "function", "function": {"name": "f"}}],
               "tool_choice": "required", "guided_regex": "a")"),
       "tool_choice", "cannot be combined"},
      {with(R"("tool_choice": {"type": "function"})"), "tool_choice.function", "Missing"},
      {with(R"("tool_choice": "sometimes")"), "tool_choice", "(allowed: \"none\""},
      {with(R"("tool_choice": 1)"), "tool_choice", "expected a string or an object"},
      {with(R"("logprobs": 3)"), "logprobs", "expected a boolean"},
      {with(R"("top_logprobs": 2)"), "top_logprobs", "'logprobs' must be true"},
      {with(R"("logprobs": true, "top_logprobs": 21)"), "top_logprobs", "out of range"},
      {with(R"("max_completion_tokens": 0)"), "max_completion_tokens", "out of range"},
      {with(R"("chat_template_kwargs": true)"), "chat_template_kwargs", "expected an object"},
      {with(R"("chat_template_kwargs": {"enable_thinking": "no"})"),
       "chat_template_kwargs.enable_thinking", "expected a boolean"},
      {with(R"("chat_template_kwargs": {"messages": []})"), "chat_template_kwargs.messages",
       "is set by the request itself"},
      {with(R"("echo": 1)"), "echo", "expected a boolean"},
      {with(R"("add_generation_prompt": "yes")"), "add_generation_prompt", "expected a boolean"},
      {with(R"("continue_final_message": true)"), "continue_final_message",
       "Cannot set both 'continue_final_message' and 'add_generation_prompt'"},
      {with(R"("chat_template_kwargs": {"add_generation_prompt": 1})"),
       "chat_template_kwargs.add_generation_prompt", "expected a boolean"},
      // vLLM checks the fields, before the kwarg overrides one.
      {with(
           R"("continue_final_message": true, "chat_template_kwargs": {"add_generation_prompt": false})"),
       "continue_final_message", "Cannot set both"},
      {with(R"("response_format": {"type": "yaml"})"), "response_format.type", "(allowed:"},
      {with(R"("response_format": {"type": "json_schema", "json_schema": {"name": "x"}})"),
       "response_format.json_schema.schema", "Missing required"},
      {with(R"("response_format": {"type": "json_schema", "json_schema": {"name": "x",
               "schema": {"type": "no such type"}}})"),
       "response_format.json_schema.schema", "Invalid value"},
      {with(R"("response_format": {"type": "json_object"}, "guided_regex": "a+")"),
       "guided_regex", "both constrain the output"},
      {with(R"("guided_regex": "(unbalanced")"), "guided_regex", "Invalid value"},
      {with(R"("guided_regex": "")"), "guided_regex", "it is empty"},
      {with(R"("guided_json": "{not json")"), "guided_json", "not a JSON document"},
      {with(R"("guided_json": 3)"), "guided_json", "expected an object"},
      {with(R"("guided_choice": [])"), "guided_choice", "a non-empty array of strings"},
      {with(R"("guided_choice": ["a", 1])"), "guided_choice[1]", "expected a string"},
      {with(R"("guided_grammar": "root ::= undefined")"), "guided_grammar", "Invalid value"},
      {with(R"("structured_outputs": {"yaml": "x"})"), "structured_outputs.yaml",
       "Unrecognized"},
      {with(R"("prompt": "x")"), "prompt", "Unrecognized"},
      {with(R"("temperature": -1)"), "temperature", "out of range"},
      {with(R"("n": 1000)"), "n", "out of range"},
  };
  for (const ErrorCase& c : cases) {
    expect_error(parse_chat_completion_request(Json::parse(c.body), kVocab, /*strict_fields=*/true),
                 c);
  }
}

TEST(ChatRequest, StructuredOutputsBecomeOneConstraint) {
  using Kind = StructuredOutput::Kind;
  const std::string messages = R"({"messages": [{"role": "user", "content": "hi"}], )";
  const auto output = [&](const std::string& fields) {
    return chat(messages + fields + "}").sampling.structured_output;
  };
  EXPECT_FALSE(output(R"("response_format": {"type": "text"})").has_value());
  EXPECT_EQ(output(R"("response_format": {"type": "json_object"})"),
            (StructuredOutput{Kind::kJsonSchema, R"({"type": "object"})"}));
  EXPECT_EQ(output(R"("response_format": {"type": "json_schema", "json_schema": {"name": "p",
                     "strict": true, "schema": {"type": "object", "properties": {"b": {}, "a": {}}}}})"),
            (StructuredOutput{Kind::kJsonSchema,
                              R"({"type":"object","properties":{"b":{},"a":{}}})"}));
  EXPECT_EQ(output(R"("guided_json": "{\"type\": \"integer\"}")"),
            (StructuredOutput{Kind::kJsonSchema, R"({"type":"integer"})"}));
  EXPECT_EQ(output(R"("guided_regex": "[a-z]+")"), (StructuredOutput{Kind::kRegex, "[a-z]+"}));
  EXPECT_EQ(output(R"("guided_choice": ["yes", "say \"no\""])"),
            (StructuredOutput{Kind::kGrammar, R"(root ::= "yes" | "say \"no\"")"}));
  EXPECT_EQ(output(R"("structured_outputs": {"regex": "\\d+"})"),
            (StructuredOutput{Kind::kRegex, "\\d+"}));
  EXPECT_EQ(output(R"("structured_outputs": {"json_object": true})"),
            (StructuredOutput{Kind::kJsonSchema, R"({"type": "object"})"}));
  const std::string tools =
      R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
                  {"type": "function", "function": {"name": "g"}}])";
  EXPECT_EQ(output(tools + R"(, "tool_choice": "required")"),
            (StructuredOutput{Kind::kToolCalls,
                              R"({"tools":[{"name":"f","parameters":{"type":"object"}},)"
                              R"({"name":"g"}],"multiple":true})"}));
  const GenerationRequest named =
      chat(messages + tools + R"(, "tool_choice": {"type": "function", "function": {"name": "g"}}})");
  EXPECT_EQ(named.tool_choice, "function");
  EXPECT_EQ(named.tool_choice_function, "g");
  EXPECT_EQ(named.sampling.structured_output,
            (StructuredOutput{Kind::kToolCalls, R"({"tools":[{"name":"g"}],"multiple":false})"}));
  EXPECT_FALSE(output(tools + R"(, "tool_choice": "auto")").has_value());
}

TEST(CompletionRequest, StructuredOutputsAreAcceptedToo) {
  EXPECT_EQ(completion(R"({"prompt": "x", "guided_regex": "a|b"})").sampling.structured_output,
            (StructuredOutput{StructuredOutput::Kind::kRegex, "a|b"}));
  EXPECT_EQ(completion(R"({"prompt": "x", "response_format": {"type": "json_object"}})")
                .sampling.structured_output->kind,
            StructuredOutput::Kind::kJsonSchema);
}

// ---- context length and sampling resolution ----------------------------------------------------

TEST(ResolveMaxTokens, ExplicitMaxTokensWithinTheContext) {
  GenerationRequest r = completion(R"({"prompt": "x", "max_tokens": 100})");
  auto max_tokens = resolve_max_tokens(r, 900, 1000);
  ASSERT_TRUE(max_tokens.ok());
  EXPECT_EQ(max_tokens.value(), 100);
}

TEST(ResolveMaxTokens, ExplicitMaxTokensBeyondTheContext) {
  GenerationRequest r = completion(R"({"prompt": "x", "max_tokens": 101})");
  auto max_tokens = resolve_max_tokens(r, 900, 1000);
  ASSERT_FALSE(max_tokens.ok());
  EXPECT_EQ(max_tokens.error().http_status, 400);
  EXPECT_EQ(max_tokens.error().param, "max_tokens");
  EXPECT_EQ(max_tokens.error().code, "context_length_exceeded");
  EXPECT_EQ(max_tokens.error().message,
            "'max_tokens' is too large: 101. This model's maximum context length is 1000 tokens "
            "and your request has 900 input tokens (101 > 1000 - 900).");
  GenerationRequest c =
      chat(R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200})");
  auto chat_tokens = resolve_max_tokens(c, 900, 1000);
  ASSERT_FALSE(chat_tokens.ok());
  EXPECT_EQ(chat_tokens.error().param, "max_completion_tokens");
}

TEST(ResolveMaxTokens, PromptThatFillsTheContext) {
  GenerationRequest r = completion(R"({"prompt": "x"})");
  for (int prompt_tokens : {1000, 1001}) {
    auto max_tokens = resolve_max_tokens(r, prompt_tokens, 1000);
    ASSERT_FALSE(max_tokens.ok());
    EXPECT_EQ(max_tokens.error().param, "prompt");
    EXPECT_EQ(max_tokens.error().message,
              "This model's maximum context length is 1000 tokens. However, your request has " +
                  std::to_string(prompt_tokens) +
                  " input tokens. Please reduce the length of the input.");
  }
  GenerationRequest c = chat(R"({"messages": [{"role": "user", "content": "hi"}]})");
  auto chat_tokens = resolve_max_tokens(c, 1000, 1000);
  ASSERT_FALSE(chat_tokens.ok());
  EXPECT_EQ(chat_tokens.error().param, "messages");
}

TEST(ResolveMaxTokens, DefaultsWhenUnset) {
  GenerationRequest r = completion(R"({"prompt": "x"})");
  EXPECT_EQ(resolve_max_tokens(r, 10, 1000).value(), 16);
  EXPECT_EQ(resolve_max_tokens(r, 990, 1000).value(), 10);  // capped to what is left
  GenerationRequest c = chat(R"({"messages": [{"role": "user", "content": "hi"}]})");
  EXPECT_EQ(resolve_max_tokens(c, 10, 1000).value(), 990);
}

TEST(ResolveMaxTokens, MinTokensAboveTheResult) {
  GenerationRequest r = completion(R"({"prompt": "x", "min_tokens": 20})");
  auto max_tokens = resolve_max_tokens(r, 10, 1000);  // default 16 < 20
  ASSERT_FALSE(max_tokens.ok());
  EXPECT_EQ(max_tokens.error().param, "min_tokens");
  GenerationRequest ok = completion(R"({"prompt": "x", "min_tokens": 20, "max_tokens": 20})");
  EXPECT_EQ(resolve_max_tokens(ok, 10, 1000).value(), 20);
}

TEST(ResolvedSampling, RequestValuesThenGenerationConfigThenBuiltIns) {
  GenerationRequest r = completion(R"({"prompt": "x", "temperature": 0.2, "presence_penalty": 1})");
  SamplingDefaults generation_config;
  generation_config.temperature = 0.6f;
  generation_config.top_p = 0.95f;
  generation_config.top_k = 20;
  auto params = r.resolved_sampling(generation_config, 64, kVocab);
  ASSERT_TRUE(params.ok());
  EXPECT_FLOAT_EQ(params->temperature, 0.2f);  // the request wins
  EXPECT_FLOAT_EQ(params->top_p, 0.95f);       // generation_config fills the gap
  EXPECT_EQ(params->top_k, 20);
  EXPECT_FLOAT_EQ(params->min_p, 0.0f);  // built-in
  EXPECT_FLOAT_EQ(params->presence_penalty, 1.0f);
  EXPECT_EQ(params->max_tokens, 64);
}

TEST(ResolvedSampling, AnInvalidResultIsA400) {
  GenerationRequest r = completion(R"({"prompt": "x", "min_tokens": 10})");
  auto params = r.resolved_sampling({}, 5, kVocab);
  ASSERT_FALSE(params.ok());
  EXPECT_EQ(params.error().http_status, 400);
  EXPECT_NE(params.error().message.find("min_tokens"), std::string::npos);
}

}  // namespace
}  // namespace pdserve
