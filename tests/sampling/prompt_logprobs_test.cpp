// One prompt position's logprobs: the token's log-softmax, its rank among the logits and the
// best alternatives, checked against a direct double-precision computation.
#include "common/sampling/prompt_logprobs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace pdserve {
namespace {

TEST(PromptTokenLogprob, RankCountsTheHigherLogitsAndTopListsTheBest) {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
  const Sampler sampler;
  const PromptTokenLogprob judged = prompt_token_logprob(sampler, logits, 4, 3).value();
  double sum = 0.0;
  for (float logit : logits) sum += std::exp(static_cast<double>(logit));
  EXPECT_NEAR(judged.logprob, 0.5 - std::log(sum), 1e-6);
  EXPECT_EQ(judged.token, 4);
  EXPECT_EQ(judged.rank, 4);  // below 3, 3 and 1
  ASSERT_EQ(judged.top.size(), 3u);
  EXPECT_EQ(judged.top[0].token, 1);  // ties go to the lower id
  EXPECT_EQ(judged.top[1].token, 3);
  EXPECT_EQ(judged.top[2].token, 0);
  EXPECT_NEAR(judged.top[2].logprob, 1.0 - std::log(sum), 1e-6);
  // The best token ranks first; tied best tokens both rank first.
  EXPECT_EQ(prompt_token_logprob(sampler, logits, 1, 0).value().rank, 1);
  EXPECT_EQ(prompt_token_logprob(sampler, logits, 3, 0).value().rank, 1);
  EXPECT_TRUE(prompt_token_logprob(sampler, logits, 3, 0).value().top.empty());
}

TEST(PromptTokenLogprob, EqualsADirectLogSoftmaxOnARandomVocabulary) {
  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> logits(151936);
  for (float& logit : logits) logit = normal(random);
  double max = logits[0];
  for (float logit : logits) max = std::max(max, static_cast<double>(logit));
  double sum = 0.0;
  for (float logit : logits) sum += std::exp(logit - max);
  const double log_normalizer = max + std::log(sum);
  const Sampler sampler;
  for (int32_t token : {0, 1234, 151935}) {
    const PromptTokenLogprob judged = prompt_token_logprob(sampler, logits, token, 20).value();
    EXPECT_NEAR(judged.logprob, logits[static_cast<size_t>(token)] - log_normalizer, 1e-5);
    int higher = 0;
    for (float logit : logits) higher += logit > logits[static_cast<size_t>(token)];
    EXPECT_EQ(judged.rank, higher + 1);
    ASSERT_EQ(judged.top.size(), 20u);
    for (size_t i = 1; i < judged.top.size(); ++i) {
      EXPECT_GE(judged.top[i - 1].logprob, judged.top[i].logprob);
    }
  }
}

TEST(PromptTokenLogprob, RefusesWhatTheSamplerRefuses) {
  const Sampler sampler;
  const std::vector<float> logits = {0.0f, NAN};
  EXPECT_FALSE(prompt_token_logprob(sampler, logits, 0, 1).ok());
  const std::vector<float> fine = {0.0f, 1.0f};
  EXPECT_FALSE(prompt_token_logprob(sampler, fine, 2, 1).ok());
  EXPECT_FALSE(prompt_token_logprob(sampler, fine, 0, kMaxLogprobs + 1).ok());
}

}  // namespace
}  // namespace pdserve
