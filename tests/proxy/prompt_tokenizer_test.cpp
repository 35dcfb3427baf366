// PromptTokenizer: the proxy's ids of a prompt are the decode node's (same parsers, template
// and tokenizer), a prompt cut to the bound tokenizes as the start of the whole one, and bodies
// a node would refuse give no ids rather than an error.
#include "proxy/routing/prompt_tokenizer.h"

#include <gtest/gtest.h>

#include <string>

#include "common/protocol/chat_prompt.h"
#include "common/protocol/openai_request.h"

namespace pdserve::proxy {
namespace {

using Json = nlohmann::json;

const std::filesystem::path kModelDir = std::filesystem::path(PDSERVE_ASSETS_DIR) / "qwen3-tokenizer";

const PromptTokenizer& prompt_tokenizer() {
  static const PromptTokenizer loaded = PromptTokenizer::load(kModelDir, 256).value();
  return loaded;
}

const Tokenizer& tokenizer() {
  static const Tokenizer loaded = Tokenizer::from_model_dir(kModelDir).value();
  return loaded;
}

std::vector<int32_t> encode(const std::string& text) { return tokenizer().encode(text).value(); }

TEST(PromptTokenizerTest, StablePrefixEndsAfterANewlineBeforeNonWhitespace) {
  EXPECT_EQ(stable_text_prefix("short", 10), "short");
  EXPECT_EQ(stable_text_prefix("ab\ncd\nef", 7), "ab\ncd\n");
  EXPECT_EQ(stable_text_prefix("ab\nc d\n ef", 8), "ab\n");  // not before a space
  EXPECT_EQ(stable_text_prefix("ab\nc\n\nd", 5), "ab\n");    // nor between newlines
  EXPECT_EQ(stable_text_prefix("ab\nc\n\nd", 6), "ab\nc\n\n");
  EXPECT_EQ(stable_text_prefix("no newline at all here", 8), "");
}

TEST(PromptTokenizerTest, CompletionPromptsGiveTheNodesIds) {
  const std::string text = "The quick brown fox jumps over the lazy dog.";
  const std::optional<PromptTokens> tokens = prompt_tokenizer().tokens(
      PromptKind::kCompletion, Json{{"prompt", text}, {"max_tokens", 4}}.dump());
  ASSERT_TRUE(tokens);
  EXPECT_TRUE(tokens->whole);
  EXPECT_EQ(tokens->ids, encode(text));
  const std::optional<PromptTokens> ids = prompt_tokenizer().tokens(
      PromptKind::kCompletion, Json{{"prompt", {5, 6, 7}}}.dump());
  ASSERT_TRUE(ids);
  EXPECT_EQ(ids->ids, (std::vector<int32_t>{5, 6, 7}));
}

TEST(PromptTokenizerTest, ChatPromptsAreRenderedWithTheModelsTemplate) {
  const Json body = {{"messages",
                      {{{"role", "system"}, {"content", "You are terse."}},
                       {{"role", "user"}, {"content", "Hi"}}}}};
  const std::optional<PromptTokens> tokens =
      prompt_tokenizer().tokens(PromptKind::kChat, body.dump());
  ASSERT_TRUE(tokens);
  const ChatTemplate chat_template =
      ChatTemplate::from_tokenizer_config(kModelDir / "tokenizer_config.json").value();
  const GenerationRequest request =
      parse_chat_completion_request(parse_json_body(body.dump()).value(), tokenizer().vocab_size())
          .value();
  EXPECT_EQ(tokens->ids, encode(render_chat_prompt(request, chat_template).value()));
}

TEST(PromptTokenizerTest, ALongPromptIsCutWhereItTokenizesAsTheWholeDoes) {
  std::string text;
  for (int line = 0; line < 40; ++line) text += "Line " + std::to_string(line) + " of the prompt\n";
  const std::optional<PromptTokens> tokens =
      prompt_tokenizer().tokens(PromptKind::kCompletion, Json{{"prompt", text}}.dump());
  ASSERT_TRUE(tokens);
  EXPECT_FALSE(tokens->whole);
  const std::vector<int32_t> whole = encode(text);
  ASSERT_LT(tokens->ids.size(), whole.size());
  EXPECT_GT(tokens->ids.size(), 10u);
  EXPECT_TRUE(std::equal(tokens->ids.begin(), tokens->ids.end(), whole.begin()));
}

TEST(PromptTokenizerTest, BodiesANodeWouldRefuseOrTooLargeGiveNoIds) {
  const PromptTokenizer& proxy = prompt_tokenizer();
  EXPECT_FALSE(proxy.tokens(PromptKind::kCompletion, "{not json"));
  EXPECT_FALSE(proxy.tokens(PromptKind::kCompletion, "[1, 2]"));
  EXPECT_FALSE(proxy.tokens(PromptKind::kCompletion, Json{{"max_tokens", 3}}.dump()));
  EXPECT_FALSE(proxy.tokens(PromptKind::kCompletion, Json{{"prompt", {-1}}}.dump()));
  EXPECT_FALSE(proxy.tokens(PromptKind::kChat, Json{{"messages", "hi"}}.dump()));
  // Over the 256-byte bound with no stable cut; a body over 4x the bound is not even parsed.
  EXPECT_FALSE(proxy.tokens(PromptKind::kCompletion, Json{{"prompt", std::string(600, 'a')}}.dump()));
  const std::string padded = Json{{"prompt", "ok"}}.dump() + std::string(4 * 256, ' ');
  EXPECT_TRUE(parse_json_body(padded).ok());
  EXPECT_FALSE(proxy.tokens(PromptKind::kCompletion, padded));
}

TEST(PromptTokenizerTest, AMissingModelFolderIsAClearError) {
  const Result<PromptTokenizer> loaded = PromptTokenizer::load("/nonexistent/model", 1024);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("/nonexistent/model"), std::string::npos)
      << loaded.status().message();
}

}  // namespace
}  // namespace pdserve::proxy
