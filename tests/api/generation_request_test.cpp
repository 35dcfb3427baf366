// prepare_generation without a server or an engine: the cluster-only fields are honoured only
// with the cluster token, the stream resumption is checked against the request's choices, and
// prompts are the tokenizer's tokens of the text (or of the rendered chat template).
#include "serving/openai/generation_request.h"

#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/cluster/cluster_auth.h"
#include "common/protocol/pdserve_headers.h"
#include "tests/tokenizer/test_support.h"

namespace pdserve {
namespace {

using Json = nlohmann::json;
using tokenizer_test::qwen3_tokenizer;

constexpr std::string_view kToken = "cluster-secret";

const ChatTemplate& chat_template() {
  static const ChatTemplate instance =
      ChatTemplate::from_tokenizer_config(PDSERVE_ASSETS_DIR
                                          "/qwen3-tokenizer/tokenizer_config.json")
          .value();
  return instance;
}
const ModelInfo& model() {
  static const ModelInfo info{"fake-model", 64, 151936, {}, {}};
  return info;
}

http::HttpRequest request(const Json& body, bool cluster_member = false,
                          bool resumable_header = false) {
  http::HttpRequest request;
  request.method = "POST";
  request.target = request.path = "/v1/completions";
  request.body = body.dump();
  if (cluster_member) {
    request.headers.emplace_back(std::string(kAuthorizationHeader),
                                 cluster_auth_header_value(kToken));
  }
  if (resumable_header) request.headers.emplace_back(std::string(kResumableHeader), "1");
  return request;
}

ApiResult<PreparedGeneration> prepare(const http::HttpRequest& http_request, bool chat = false) {
  return prepare_generation(http_request, chat,
                            {qwen3_tokenizer(), chat_template(), model(), false, false, kToken});
}

// A resumption as the proxy writes it (StreamResume's own serialiser).
Json resume_of(int choices) {
  StreamResume resume{"cmpl-abc", 1700000000, {}};
  resume.choices.resize(static_cast<size_t>(choices));
  return resume.to_json();
}

TEST(PrepareGeneration, PromptsAreTheTokenizersTokensWithNChoicesEach) {
  ApiResult<PreparedGeneration> prepared =
      prepare(request({{"prompt", Json::array({"one", "two three"})}, {"n", 2}}));
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  ASSERT_EQ(prepared.value().prompts.size(), 2u);
  EXPECT_EQ(prepared.value().prompts[0].tokens, qwen3_tokenizer().encode("one").value());
  EXPECT_EQ(prepared.value().prompts[1].tokens, qwen3_tokenizer().encode("two three").value());
  EXPECT_EQ(prepared.value().num_choices(), 4u);
  EXPECT_FALSE(prepared.value().resume);
  EXPECT_FALSE(prepared.value().resumable);
}

TEST(PrepareGeneration, AChatPromptIsTheRenderedTemplateTokenized) {
  const Json messages = Json::array({{{"role", "user"}, {"content", "Hi"}}});
  ApiResult<PreparedGeneration> prepared = prepare(request({{"messages", messages}}), true);
  ASSERT_TRUE(prepared.ok()) << prepared.error().message;
  ASSERT_EQ(prepared.value().prompts.size(), 1u);
  const std::string text = qwen3_tokenizer().decode(prepared.value().prompts[0].tokens, false).value();
  EXPECT_NE(text.find("<|im_start|>user\nHi<|im_end|>"), std::string::npos) << text;
  EXPECT_TRUE(text.ends_with("<|im_start|>assistant\n")) << text;
}

TEST(PrepareGeneration, AResumptionNeedsTheClusterToken) {
  const Json body = {{"prompt", "hi"}, {"stream", true}, {kStreamResumeField, resume_of(1)}};
  ApiResult<PreparedGeneration> stranger = prepare(request(body));
  ASSERT_FALSE(stranger.ok());
  EXPECT_EQ(stranger.error().http_status, 401);
  ApiResult<PreparedGeneration> member = prepare(request(body, /*cluster_member=*/true));
  ASSERT_TRUE(member.ok()) << member.error().message;
  ASSERT_TRUE(member.value().resume);
  EXPECT_EQ(member.value().resume->id, "cmpl-abc");
}

TEST(PrepareGeneration, AResumptionMustMatchAStreamAndItsChoices) {
  ApiResult<PreparedGeneration> not_streamed =
      prepare(request({{"prompt", "hi"}, {kStreamResumeField, resume_of(1)}}, true));
  ASSERT_FALSE(not_streamed.ok());
  EXPECT_EQ(not_streamed.error().http_status, 400);
  EXPECT_EQ(not_streamed.error().param, kStreamResumeField);
  ApiResult<PreparedGeneration> wrong_count = prepare(request(
      {{"prompt", "hi"}, {"stream", true}, {"n", 3}, {kStreamResumeField, resume_of(2)}}, true));
  ASSERT_FALSE(wrong_count.ok());
  EXPECT_NE(wrong_count.error().message.find("has 2 choices; the request has 3"), std::string::npos)
      << wrong_count.error().message;
}

TEST(PrepareGeneration, CheckpointsOnlyForAClusterMembersStream) {
  const Json stream = {{"prompt", "hi"}, {"stream", true}};
  EXPECT_FALSE(prepare(request(stream, false, true)).value().resumable);
  EXPECT_TRUE(prepare(request(stream, true, true)).value().resumable);
  EXPECT_FALSE(prepare(request({{"prompt", "hi"}}, true, true)).value().resumable);
}

TEST(PrepareGeneration, EchoWithLogprobsAsksForPromptLogprobs) {
  ApiResult<PreparedGeneration> echo_logprobs =
      prepare(request({{"prompt", "hi"}, {"echo", true}, {"logprobs", 3}, {"prompt_logprobs", 1}}));
  ASSERT_TRUE(echo_logprobs.ok()) << echo_logprobs.error().message;
  // As many alternatives as either field asks; the client's own prompt_logprobs is kept.
  EXPECT_EQ(echo_logprobs.value().request.sampling.prompt_logprobs, 3);
  EXPECT_EQ(echo_logprobs.value().request.prompt_logprobs, 1);
  ApiResult<PreparedGeneration> plain = prepare(request({{"prompt", "hi"}, {"logprobs", 3}}));
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain.value().request.sampling.prompt_logprobs.has_value());
}

TEST(PrepareGeneration, RefusesWhatCannotBeServed) {
  ApiResult<PreparedGeneration> other_model = prepare(request({{"prompt", "hi"}, {"model", "x"}}));
  ASSERT_FALSE(other_model.ok());
  EXPECT_EQ(other_model.error().http_status, 404);
  ApiResult<PreparedGeneration> empty = prepare(request({{"prompt", ""}}));
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.error().param, "prompt");
}

TEST(PrepareGeneration, ChatEchoIsTheLastMessageOfTheAnswersRole) {
  const Json user_turn = Json::array({{{"role", "user"}, {"content", "Hi"}}});
  EXPECT_EQ(prepare(request({{"messages", user_turn}, {"echo", true}}), true).value().chat_echo,
            "");
  EXPECT_EQ(
      prepare(request({{"messages", user_turn}, {"echo", true}, {"add_generation_prompt", false}}),
              true)
          .value()
          .chat_echo,
      "Hi");
}

}  // namespace
}  // namespace pdserve
