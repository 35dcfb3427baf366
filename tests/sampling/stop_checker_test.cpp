#include "common/sampling/stop_checker.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/core/files.h"
#include "common/sampling/sampler.h"

namespace pdserve {
namespace {

constexpr int kVocab = 151936;

class StopCheckerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The real Qwen3 EOS ids: 151645 <|im_end|> and 151643 <|endoftext|>.
    Result<nlohmann::json> config =
        read_json_file(std::string(PDSERVE_ASSETS_DIR) + "/qwen3-0.6b/generation_config.json");
    ASSERT_TRUE(config.ok()) << config.status().to_string();
    eos_ = (*config)["eos_token_id"].get<std::vector<int32_t>>();
    ASSERT_EQ(eos_, (std::vector<int32_t>{151645, 151643}));
  }

  StopChecker make(const SamplingParams& params) const {
    Result<StopChecker> checker = StopChecker::create(params, eos_, kVocab);
    PDS_CHECK(checker.ok(), checker.status().to_string());
    return std::move(checker).value();
  }

  std::vector<int32_t> eos_;
};

TEST_F(StopCheckerTest, EveryEosIdStops) {
  SamplingParams params;
  StopChecker checker = make(params);
  EXPECT_EQ(checker.check(std::vector<int32_t>{}), FinishReason::kNone);
  EXPECT_EQ(checker.check(std::vector<int32_t>{10, 20}), FinishReason::kNone);
  EXPECT_EQ(checker.check(std::vector<int32_t>{10, 151645}), FinishReason::kStop);
  EXPECT_EQ(checker.check(std::vector<int32_t>{10, 151643}), FinishReason::kStop);
  // Only the last token counts.
  EXPECT_EQ(checker.check(std::vector<int32_t>{151645, 10}), FinishReason::kNone);
}

TEST_F(StopCheckerTest, StopTokenIdsStopEvenWhenEosIsIgnored) {
  SamplingParams params;
  params.ignore_eos = true;
  params.stop_token_ids = {42, 7};
  StopChecker checker = make(params);
  EXPECT_EQ(checker.check(std::vector<int32_t>{1, 151645}), FinishReason::kNone);
  EXPECT_EQ(checker.check(std::vector<int32_t>{1, 151643}), FinishReason::kNone);
  EXPECT_EQ(checker.check(std::vector<int32_t>{1, 7}), FinishReason::kStop);
  EXPECT_EQ(checker.check(std::vector<int32_t>{1, 42}), FinishReason::kStop);
}

TEST_F(StopCheckerTest, MaxTokensEndsWithLengthAndTakesPrecedence) {
  SamplingParams params;
  params.max_tokens = 3;
  StopChecker checker = make(params);
  EXPECT_EQ(checker.check(std::vector<int32_t>{1, 2}), FinishReason::kNone);
  EXPECT_EQ(checker.check(std::vector<int32_t>{1, 2, 3}), FinishReason::kLength);
  EXPECT_EQ(checker.check(std::vector<int32_t>{1, 2, 151645}), FinishReason::kLength);
  EXPECT_EQ(checker.check(std::vector<int32_t>{1, 151645}), FinishReason::kStop);
}

TEST_F(StopCheckerTest, NoStopBeforeMinTokens) {
  SamplingParams params;
  params.min_tokens = 3;
  params.stop_token_ids = {42};
  StopChecker checker = make(params);
  EXPECT_EQ(checker.check(std::vector<int32_t>{151645}), FinishReason::kNone);
  EXPECT_EQ(checker.check(std::vector<int32_t>{1, 42}), FinishReason::kNone);
  EXPECT_EQ(checker.check(std::vector<int32_t>{1, 2, 151643}), FinishReason::kStop);
  EXPECT_EQ(checker.check(std::vector<int32_t>{1, 2, 42}), FinishReason::kStop);
}

TEST_F(StopCheckerTest, MinTokensBansEosAndStopIdsUntilReached) {
  SamplingParams params;
  params.min_tokens = 2;
  params.stop_token_ids = {42, 151645};
  StopChecker checker = make(params);
  const std::vector<int32_t> expected = {42, 151643, 151645};
  EXPECT_EQ(std::vector<int32_t>(checker.min_tokens_banned_ids(0).begin(),
                                 checker.min_tokens_banned_ids(0).end()),
            expected);
  EXPECT_EQ(checker.min_tokens_banned_ids(1).size(), 3u);
  EXPECT_TRUE(checker.min_tokens_banned_ids(2).empty());

  params.ignore_eos = true;  // EOS cannot end the sequence, so it is not banned
  StopChecker ignoring = make(params);
  EXPECT_EQ(std::vector<int32_t>(ignoring.min_tokens_banned_ids(0).begin(),
                                 ignoring.min_tokens_banned_ids(0).end()),
            (std::vector<int32_t>{42, 151645}));
}

TEST_F(StopCheckerTest, MaskSetsBannedLogitsToMinusInfinity) {
  SamplingParams params;
  params.min_tokens = 1;
  StopChecker checker = make(params);
  std::vector<float> logits(kVocab, 0.5f);
  ASSERT_TRUE(checker.apply_min_tokens_mask(logits, 0).ok());
  for (int i = 0; i < kVocab; ++i) {
    const bool banned = i == 151643 || i == 151645;
    ASSERT_EQ(std::isinf(logits[i]) && logits[i] < 0, banned) << i;
  }
  std::vector<float> after(kVocab, 0.5f);
  ASSERT_TRUE(checker.apply_min_tokens_mask(after, 1).ok());
  EXPECT_EQ(after, std::vector<float>(kVocab, 0.5f));

  std::vector<float> wrong_size(100, 0.0f);
  EXPECT_EQ(checker.apply_min_tokens_mask(wrong_size, 0).code(), StatusCode::kInvalidArgument);
}

TEST_F(StopCheckerTest, GenerationLoopRunsAtLeastMinTokensThenStopsOnEos) {
  // EOS dominates the distribution: without the mask the first draw would almost surely end
  // the sequence.
  std::vector<float> logits(kVocab, 0.0f);
  logits[151645] = 12.0f;
  SamplingParams params;
  params.min_tokens = 5;
  params.max_tokens = 50;
  StopChecker checker = make(params);
  Sampler sampler;
  SamplerRng rng(31);
  std::vector<int32_t> output;
  FinishReason reason = FinishReason::kNone;
  while (reason == FinishReason::kNone) {
    std::vector<float> step = logits;
    ASSERT_TRUE(checker.apply_min_tokens_mask(step, output.size()).ok());
    Result<SampleResult> result = sampler.sample(step, params, {}, output, rng);
    ASSERT_TRUE(result.ok()) << result.status().to_string();
    output.push_back(result->token);
    reason = checker.check(output);
  }
  EXPECT_EQ(reason, FinishReason::kStop);
  EXPECT_EQ(output.size(), 6u);  // five forced tokens, then EOS at once (p ~ 0.59 each step)
  for (size_t i = 0; i + 1 < output.size(); ++i) EXPECT_NE(output[i], 151645);
  EXPECT_EQ(output.back(), 151645);
}

TEST_F(StopCheckerTest, CreateRejectsBadInput) {
  SamplingParams params;
  const std::vector<int32_t> bad_eos = {kVocab};
  Result<StopChecker> checker = StopChecker::create(params, bad_eos, kVocab);
  ASSERT_FALSE(checker.ok());
  EXPECT_NE(checker.status().message().find("eos_token_ids[0]"), std::string::npos);
  params.max_tokens = 0;
  EXPECT_EQ(StopChecker::create(params, eos_, kVocab).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(FinishReason, OpenAiNames) {
  EXPECT_EQ(finish_reason_name(FinishReason::kStop), "stop");
  EXPECT_EQ(finish_reason_name(FinishReason::kLength), "length");
  EXPECT_EQ(finish_reason_name(FinishReason::kNone), "");
}

}  // namespace
}  // namespace pdserve
