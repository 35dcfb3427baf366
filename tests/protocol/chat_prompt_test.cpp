// The chat path end to end (OpenAI body -> parse -> render with the real Qwen3 template),
// checked against the transformers goldens of the chat module (tests/data/chat).
#include "common/protocol/chat_prompt.h"

#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "common/protocol/reasoning_parser.h"

namespace pdserve {
namespace {

using Json = nlohmann::ordered_json;
constexpr int kVocab = 151936;

ChatTemplate qwen3_template() {
  auto chat_template = ChatTemplate::from_tokenizer_config(
      std::string(PDSERVE_ASSETS_DIR) + "/qwen3-tokenizer/tokenizer_config.json");
  PDS_CHECK(chat_template.ok(), chat_template.status().to_string());
  return std::move(chat_template).value();
}

// The OpenAI request that asks for the golden's template context.
Json request_body(const Json& context, bool content_as_parts) {
  Json body;
  body["messages"] = context["messages"];
  if (content_as_parts) {
    for (Json& message : body["messages"]) {
      if (message["content"].is_string()) {
        message["content"] = Json::array({{{"type", "text"}, {"text", message["content"]}}});
      }
    }
  }
  // The wire form of object arguments: a JSON string (compact, unlike the template's tojson),
  // which must render as transformers rendered the object.
  for (Json& message : body["messages"]) {
    if (!message.contains("tool_calls")) continue;
    for (Json& call : message["tool_calls"]) {
      if (call.contains("function") && call["function"]["arguments"].is_object()) {
        call["function"]["arguments"] = call["function"]["arguments"].dump();
      }
    }
  }
  if (context.contains("tools")) body["tools"] = context["tools"];
  Json kwargs = Json::object();
  if (context.contains("enable_thinking")) kwargs["enable_thinking"] = context["enable_thinking"];
  kwargs["add_generation_prompt"] = context["add_generation_prompt"];
  body["chat_template_kwargs"] = kwargs;
  return body;
}

TEST(ChatPrompt, RendersLikeTheJinjaOracle) {
  ChatTemplate chat_template = qwen3_template();
  std::ifstream goldens(std::string(PDSERVE_TEST_DATA_DIR) + "/chat/qwen3_golden.jsonl");
  ASSERT_TRUE(goldens.good());
  int compared = 0;
  int refused = 0;
  std::string line;
  while (std::getline(goldens, line)) {
    Json golden = Json::parse(line);
    for (bool content_as_parts : {false, true}) {
      auto request =
          parse_chat_completion_request(request_body(golden["context"], content_as_parts), kVocab);
      if (!request.ok()) {
        // Only contexts outside the OpenAI schema may be refused: tool calls without the
        // "function" wrapper, tools without {"type": "function"}.
        const std::string& param = request.error().param.value_or("");
        EXPECT_TRUE(param.ends_with(".function") || param.starts_with("tools["))
            << request.error().message;
        ++refused;
        continue;
      }
      auto prompt = render_chat_prompt(request.value(), chat_template);
      ASSERT_TRUE(prompt.ok()) << prompt.error().message;
      EXPECT_EQ(prompt.value(), golden["rendered"].get<std::string>()) << line;
      // The Qwen3 template never leaves the assistant turn inside a think block.
      EXPECT_FALSE(prompt_ends_in_reasoning(prompt.value()));
      ++compared;
    }
  }
  // 108 of 120: object arguments are sent as JSON strings; the 12 refused lack the wrapper.
  EXPECT_GE(compared, 108) << "refused " << refused;
}

TEST(ChatPrompt, EnableThinkingFalseClosesTheThinkBlock) {
  auto request = parse_chat_completion_request(
      Json::parse(R"({"messages": [{"role": "user", "content": "Hello!"}],
                      "chat_template_kwargs": {"enable_thinking": false}})"),
      kVocab);
  ASSERT_TRUE(request.ok());
  auto prompt = render_chat_prompt(request.value(), qwen3_template());
  ASSERT_TRUE(prompt.ok());
  EXPECT_EQ(prompt.value(),
            "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

// continue_final_message: the prompt is the render without the template's end of the last
// turn (transformers' rule), so the model continues "The answer is".
TEST(ChatPrompt, ContinueFinalMessageEndsAfterItsContent) {
  const std::string messages = R"([{"role": "developer", "content": "Be terse."},
      {"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "The answer is"}])";
  auto whole = parse_chat_completion_request(
      Json::parse(R"({"add_generation_prompt": false, "messages": )" + messages + "}"), kVocab);
  auto continued = parse_chat_completion_request(
      Json::parse(R"({"add_generation_prompt": false, "continue_final_message": true,
                      "messages": )" +
                  messages + "}"),
      kVocab);
  ASSERT_TRUE(whole.ok() && continued.ok());
  auto full = render_chat_prompt(whole.value(), qwen3_template());
  auto prompt = render_chat_prompt(continued.value(), qwen3_template());
  ASSERT_TRUE(full.ok() && prompt.ok());
  EXPECT_TRUE(full.value().starts_with("<|im_start|>system\nBe terse.<|im_end|>\n"));
  EXPECT_TRUE(full.value().ends_with("The answer is<|im_end|>\n")) << full.value();
  EXPECT_EQ(prompt.value(), full.value().substr(0, full.value().rfind("<|im_end|>")));
  // A template that drops the message cannot be continued.
  auto dropping = ChatTemplate::parse("{{ messages[0].content }}");
  ASSERT_TRUE(dropping.ok());
  auto refused = render_chat_prompt(continued.value(), dropping.value());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().param, "continue_final_message");
}

// add_generation_prompt false: no assistant turn is opened.
TEST(ChatPrompt, AddGenerationPromptFalseOpensNoTurn) {
  auto request = parse_chat_completion_request(
      Json::parse(R"({"messages": [{"role": "user", "content": "Hello!"}],
                      "add_generation_prompt": false})"),
      kVocab);
  ASSERT_TRUE(request.ok());
  auto prompt = render_chat_prompt(request.value(), qwen3_template());
  ASSERT_TRUE(prompt.ok());
  EXPECT_EQ(prompt.value(), "<|im_start|>user\nHello!<|im_end|>\n");
}

TEST(ChatPrompt, TemplateErrorsAre400s) {
  // A template that refuses the conversation, as many do for a wrong turn order.
  auto chat_template = ChatTemplate::parse(
      "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with a "
      "user turn.') }}{% endif %}{{ messages[0].content }}");
  ASSERT_TRUE(chat_template.ok()) << chat_template.status().to_string();
  auto request = parse_chat_completion_request(
      Json::parse(R"({"messages": [{"role": "system", "content": "s"}]})"), kVocab);
  ASSERT_TRUE(request.ok());
  auto prompt = render_chat_prompt(request.value(), chat_template.value());
  ASSERT_FALSE(prompt.ok());
  EXPECT_EQ(prompt.error().http_status, 400);
  EXPECT_EQ(prompt.error().param, "messages");
  EXPECT_NE(prompt.error().message.find("Conversations must start with a user turn."),
            std::string::npos)
      << prompt.error().message;
}

TEST(ChatPrompt, ContextCarriesKwargsMessagesAndTools) {
  auto request =
      parse_chat_completion_request(Json::parse(R"({"messages": [{"role": "user", "content": "hi"}],
                      "tools": [{"type": "function", "function": {"name": "f"}}],
                      "chat_template_kwargs": {"enable_thinking": true}})"),
                                    kVocab);
  ASSERT_TRUE(request.ok());
  EXPECT_EQ(
      chat_template_context(request.value()).dump(),
      R"({"enable_thinking":true,"messages":[{"role":"user","content":"hi"}],)"
      R"("tools":[{"type":"function","function":{"name":"f"}}],"add_generation_prompt":true})");
}

}  // namespace
}  // namespace pdserve
