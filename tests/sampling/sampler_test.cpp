#include "common/sampling/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "tests/sampling/test_logits.h"

namespace pdserve {
namespace {

using testing::random_logits;
using testing::reference_distribution;

constexpr size_t kQwenVocab = 151936;
constexpr float kInf = std::numeric_limits<float>::infinity();

SamplingParams random_params(float temperature) {
  SamplingParams params;
  params.temperature = temperature;
  return params;
}

// The ids of the k largest logits (distinct logits assumed).
std::set<int32_t> k_best(const std::vector<float>& logits, size_t k) {
  std::vector<int32_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  return {order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k)};
}

TEST(Sampler, TopKNeverPicksOutsideTheKBest) {
  const std::vector<float> logits = random_logits(5000, 1);
  Sampler sampler;
  SamplerRng rng(2);
  for (int top_k : {1, 5, 40}) {
    SamplingParams params = random_params(1.5f);
    params.top_k = top_k;
    const std::set<int32_t> best = k_best(logits, static_cast<size_t>(top_k));
    std::set<int32_t> drawn;
    for (int i = 0; i < 4000; ++i) {
      Result<SampleResult> result = sampler.sample(logits, params, {}, {}, rng);
      ASSERT_TRUE(result.ok()) << result.status().to_string();
      ASSERT_TRUE(best.count(result->token)) << "top_k " << top_k << " drew " << result->token;
      drawn.insert(result->token);
    }
    // Not degenerate: with temperature 1.5 every one of the k best comes up.
    EXPECT_EQ(drawn.size(), best.size()) << "top_k " << top_k;
  }
}

TEST(Sampler, TopKKeepsEveryTokenTiedWithTheKth) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 2.0f, 0.0f};
  SamplingParams params = random_params(1.0f);
  params.top_k = 2;
  Sampler sampler;
  Result<std::vector<TokenProbability>> kept = sampler.distribution(logits, params, {}, {});
  ASSERT_TRUE(kept.ok());
  std::vector<int32_t> tokens;
  for (const TokenProbability& entry : *kept) tokens.push_back(entry.token);
  EXPECT_EQ(tokens, (std::vector<int32_t>{1, 2, 3}));
}

TEST(Sampler, TopPPicksOnlyFromTheSmallestPrefixReachingP) {
  const std::vector<float> logits = random_logits(2000, 3, 1.0);
  Sampler sampler;
  SamplerRng rng(4);
  for (float top_p : {0.1f, 0.5f, 0.9f}) {
    SamplingParams params = random_params(0.8f);
    params.top_p = top_p;
    testing::ReferenceDistribution reference = reference_distribution(logits, 0.8, 0, top_p, 0);
    ASSERT_GT(reference.margin, 1e-5) << "test data too close to the top_p boundary";
    const std::set<int32_t> prefix(reference.tokens.begin(), reference.tokens.end());
    std::set<int32_t> drawn;
    for (int i = 0; i < 3000; ++i) {
      Result<SampleResult> result = sampler.sample(logits, params, {}, {}, rng);
      ASSERT_TRUE(result.ok()) << result.status().to_string();
      ASSERT_TRUE(prefix.count(result->token)) << "top_p " << top_p << " drew " << result->token;
      drawn.insert(result->token);
    }
    EXPECT_GT(drawn.size(), prefix.size() / 2) << "top_p " << top_p;
  }
}

TEST(Sampler, TopPAlwaysKeepsAtLeastOneToken) {
  const std::vector<float> logits = {0.0f, 0.0f, 0.0f, 0.0f};
  SamplingParams params = random_params(1.0f);
  params.top_p = 1e-6f;
  Sampler sampler;
  Result<std::vector<TokenProbability>> kept = sampler.distribution(logits, params, {}, {});
  ASSERT_TRUE(kept.ok());
  ASSERT_EQ(kept->size(), 1u);
  EXPECT_EQ((*kept)[0].token, 0);  // ties go to the lower id
  EXPECT_EQ((*kept)[0].probability, 1.0);
}

TEST(Sampler, MinPDropsTokensBelowTheScaledMaximum) {
  const std::vector<float> logits = random_logits(3000, 5, 1.0);
  Sampler sampler;
  SamplerRng rng(6);
  const double temperature = 0.7;
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  for (float min_p : {0.05f, 0.3f}) {
    SamplingParams params = random_params(static_cast<float>(temperature));
    params.min_p = min_p;
    for (int i = 0; i < 3000; ++i) {
      Result<SampleResult> result = sampler.sample(logits, params, {}, {}, rng);
      ASSERT_TRUE(result.ok());
      // p(token) / p(max) in double.
      double ratio = std::exp((logits[result->token] - max_logit) / temperature);
      ASSERT_GE(ratio, min_p * (1 - 1e-6)) << "token " << result->token;
    }
  }
}

TEST(Sampler, MinPIsAppliedBeforeTopPAsInVllmV1) {
  // Probabilities 0.4, 0.3, 0.1, 0.1, 0.1. min_p 0.3 drops the 0.1s (below 0.12); top_p 0.5
  // then sees 0.571, 0.429 and keeps only token 0. Applied the other way round, top_p 0.5 on
  // the full distribution would keep tokens 0 and 1.
  const std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.1f), std::log(0.1f),
                                     std::log(0.1f)};
  SamplingParams params = random_params(1.0f);
  params.min_p = 0.3f;
  params.top_p = 0.5f;
  Sampler sampler;
  Result<std::vector<TokenProbability>> kept = sampler.distribution(logits, params, {}, {});
  ASSERT_TRUE(kept.ok());
  ASSERT_EQ(kept->size(), 1u);
  EXPECT_EQ((*kept)[0].token, 0);
}

TEST(Sampler, GreedyBelowTheTemperatureThresholdWithTiesToTheLowestId) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  Sampler sampler;
  SamplerRng rng(8);
  const SamplerRng::State before = rng.state();
  for (float temperature : {0.0f, 1e-6f, 9.9e-6f}) {
    SamplingParams params = random_params(temperature);
    params.top_k = 1000;  // ignored when greedy
    Result<SampleResult> result = sampler.sample(logits, params, {}, {}, rng);
    ASSERT_TRUE(result.ok());
    EXPECT_EQ(result->token, 1);
  }
  EXPECT_EQ(rng.state(), before) << "greedy sampling must not consume random draws";
}

TEST(Sampler, TemperatureTowardsZeroEqualsGreedy) {
  // Logits at least 0.01 apart: at temperature 1e-4 every other token's weight is below
  // exp(-100), which is 0 in float, so sampling must return the argmax every time.
  std::vector<float> logits = random_logits(kQwenVocab, 9);
  std::sort(logits.begin(), logits.end());
  logits.erase(
      std::unique(logits.begin(), logits.end(), [](float a, float b) { return b - a < 0.01f; }),
      logits.end());
  SamplerRng shuffle(10);
  for (size_t i = logits.size() - 1; i > 0; --i) {
    std::swap(logits[i], logits[shuffle.next_u64() % (i + 1)]);
  }
  const int32_t argmax =
      static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  Sampler sampler;
  SamplerRng rng(11);
  for (int i = 0; i < 50; ++i) {
    Result<SampleResult> result = sampler.sample(logits, random_params(1e-4f), {}, {}, rng);
    ASSERT_TRUE(result.ok());
    EXPECT_EQ(result->token, argmax);
  }
}

TEST(Sampler, SameSeedSameDrawsDifferentSeedsDiffer) {
  const std::vector<float> logits = random_logits(1000, 12, 0.5);
  auto draws = [&](uint64_t seed) {
    Sampler sampler;
    SamplerRng rng(seed);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 200; ++i) tokens.push_back(sampler.sample(logits, {}, {}, {}, rng)->token);
    return tokens;
  };
  EXPECT_EQ(draws(2024), draws(2024));
  EXPECT_NE(draws(2024), draws(2025));
}

TEST(Sampler, PenaltiesMatchAHandComputedReference) {
  SamplingParams params;
  params.repetition_penalty = 1.5f;
  params.frequency_penalty = 0.5f;
  params.presence_penalty = 0.25f;
  std::vector<float> logits = {2.0f, -1.0f, 3.0f, 0.5f, 1.0f, -2.0f, 0.0f};
  const std::vector<int32_t> prompt = {0, 2, 2, 6};
  const std::vector<int32_t> output = {2, 3, 3, 5, 3};
  Sampler sampler;
  ASSERT_TRUE(sampler.apply_penalties(logits, params, prompt, output).ok());
  // Token 0: prompt only, positive: 2 / 1.5.
  // Token 1, 4: never seen, unchanged.
  // Token 2: prompt and output (count 1): 3 / 1.5 - 0.5 * 1 - 0.25 = 1.25.
  // Token 3: output count 3, positive: 0.5 / 1.5 - 0.5 * 3 - 0.25 = 1/3 - 1.75.
  // Token 5: output count 1, negative: -2 * 1.5 - 0.5 - 0.25 = -3.75.
  // Token 6: prompt only, zero is not positive: 0 * 1.5 = 0.
  EXPECT_FLOAT_EQ(logits[0], 4.0f / 3.0f);
  EXPECT_EQ(logits[1], -1.0f);
  EXPECT_FLOAT_EQ(logits[2], 1.25f);
  EXPECT_FLOAT_EQ(logits[3], 1.0f / 3.0f - 1.75f);
  EXPECT_EQ(logits[4], 1.0f);
  EXPECT_FLOAT_EQ(logits[5], -3.75f);
  EXPECT_EQ(logits[6], 0.0f);

  // Scratch buffers are cleared between calls: the same call on fresh logits gives the same.
  std::vector<float> again = {2.0f, -1.0f, 3.0f, 0.5f, 1.0f, -2.0f, 0.0f};
  ASSERT_TRUE(sampler.apply_penalties(again, params, prompt, output).ok());
  EXPECT_EQ(again, logits);
  // And with no history nothing changes.
  std::vector<float> untouched = {2.0f, -1.0f};
  ASSERT_TRUE(sampler.apply_penalties(untouched, params, {}, {}).ok());
  EXPECT_EQ(untouched, (std::vector<float>{2.0f, -1.0f}));
}

TEST(Sampler, NegativePenaltiesRaiseLogits) {
  SamplingParams params;
  params.repetition_penalty = 0.5f;
  params.frequency_penalty = -1.0f;
  params.presence_penalty = -0.5f;
  std::vector<float> logits = {2.0f, -2.0f};
  const std::vector<int32_t> output = {0, 1, 1};
  Sampler sampler;
  ASSERT_TRUE(sampler.apply_penalties(logits, params, {}, output).ok());
  EXPECT_FLOAT_EQ(logits[0], 2.0f / 0.5f + 1.0f + 0.5f);
  EXPECT_FLOAT_EQ(logits[1], -2.0f * 0.5f + 2.0f + 0.5f);
}

TEST(Sampler, PenaltiesSteerGreedySampling) {
  const std::vector<float> logits = {5.0f, 4.9f, 1.0f};
  SamplingParams params = random_params(0.0f);
  Sampler sampler;
  SamplerRng rng(1);
  EXPECT_EQ(sampler.sample(logits, params, {}, std::vector<int32_t>{0}, rng)->token, 0);
  params.presence_penalty = 0.2f;
  EXPECT_EQ(sampler.sample(logits, params, {}, std::vector<int32_t>{0}, rng)->token, 1);
  params.presence_penalty = 0.0f;
  params.repetition_penalty = 1.1f;  // 5 / 1.1 < 4.9, on a prompt token
  EXPECT_EQ(sampler.sample(logits, params, std::vector<int32_t>{0}, {}, rng)->token, 1);
}

TEST(Sampler, ApplyPenaltiesChecksItsInput) {
  SamplingParams params;
  params.presence_penalty = 0.5f;
  std::vector<float> logits = {1.0f, 2.0f};
  Sampler sampler;
  Status status = sampler.apply_penalties(logits, params, {}, std::vector<int32_t>{1, 2});
  EXPECT_EQ(status.message(), "output_tokens[1] = 2 is outside the vocabulary [0, 2)");
  params.presence_penalty = 3.0f;
  EXPECT_EQ(sampler.apply_penalties(logits, params, {}, {}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(logits, (std::vector<float>{1.0f, 2.0f}));
}

TEST(Sampler, PenaltyOverflowIsAnError) {
  SamplingParams params;
  params.repetition_penalty = 1e-30f;
  const std::vector<float> logits = {1e10f, 0.0f};
  Sampler sampler;
  SamplerRng rng(1);
  Result<SampleResult> result = sampler.sample(logits, params, std::vector<int32_t>{0}, {}, rng);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find("token 0"), std::string::npos);
}

// log-softmax in double, computed independently of the sampler.
std::vector<double> log_softmax(const std::vector<float>& logits) {
  double max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float logit : logits) sum += std::exp(logit - max_logit);
  const double log_normalizer = max_logit + std::log(sum);
  std::vector<double> result;
  for (float logit : logits) result.push_back(logit - log_normalizer);
  return result;
}

TEST(Sampler, LogprobsAreTheLogSoftmaxOfTheRawLogits) {
  const std::vector<float> logits = random_logits(kQwenVocab, 13);
  const std::vector<double> expected = log_softmax(logits);
  std::vector<int32_t> by_logprob(logits.size());
  for (size_t i = 0; i < by_logprob.size(); ++i) by_logprob[i] = static_cast<int32_t>(i);
  std::stable_sort(by_logprob.begin(), by_logprob.end(),
                   [&](int32_t a, int32_t b) { return expected[a] > expected[b]; });

  // Penalties, temperature, top-k and banned ids must not change the reported logprobs.
  SamplingParams params = random_params(0.5f);
  params.top_k = 50;
  params.want_logprobs = true;
  params.logprobs = 20;
  params.repetition_penalty = 1.3f;
  params.frequency_penalty = 0.4f;
  const std::vector<int32_t> prompt = {by_logprob[0], by_logprob[1]};
  const std::vector<int32_t> output = {by_logprob[2], by_logprob[2]};
  const std::vector<int32_t> banned = {by_logprob[3]};
  Sampler sampler;
  SamplerRng rng(14);
  for (int i = 0; i < 20; ++i) {
    Result<SampleResult> result = sampler.sample(logits, params, prompt, output, rng, banned);
    ASSERT_TRUE(result.ok()) << result.status().to_string();
    EXPECT_NEAR(result->logprob, expected[result->token], 1e-5);
    ASSERT_EQ(result->top_logprobs.size(), 20u);
    for (size_t j = 0; j < 20; ++j) {
      EXPECT_EQ(result->top_logprobs[j].token, by_logprob[j]);
      EXPECT_NEAR(result->top_logprobs[j].logprob, expected[by_logprob[j]], 1e-5);
    }
  }
}

TEST(Sampler, ScriptedOutputReplacesTheDrawUntilItRunsOut) {
  const std::vector<float> logits = random_logits(kQwenVocab, 21);
  const std::vector<double> expected = log_softmax(logits);
  SamplingParams params = random_params(0.0f);  // greedy: the argmax unless scripted
  params.want_logprobs = true;
  params.scripted_output = {7, 151645, 7};
  const int32_t argmax =
      static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  ASSERT_NE(argmax, 7);
  Sampler sampler;
  SamplerRng rng(3);
  std::vector<int32_t> output;
  for (int32_t want : {7, 151645, 7, argmax}) {
    Result<SampleResult> result = sampler.sample(logits, params, {}, output, rng);
    ASSERT_TRUE(result.ok()) << result.status().to_string();
    EXPECT_EQ(result->token, want) << "output position " << output.size();
    EXPECT_NEAR(result->logprob, expected[want], 1e-5);  // the raw logprob of what was taken
    output.push_back(result->token);
  }
  params.scripted_output = {static_cast<int32_t>(kQwenVocab)};
  EXPECT_FALSE(sampler.sample(logits, params, {}, {}, rng).ok()) << "ids outside the vocabulary";
}

TEST(Sampler, LogprobsOnlyWhenRequestedAndTiesGoToTheLowerId) {
  const std::vector<float> logits = {1.0f, 2.0f, 2.0f, 0.0f};
  Sampler sampler;
  SamplerRng rng(15);
  SamplingParams params = random_params(0.0f);
  Result<SampleResult> plain = sampler.sample(logits, params, {}, {}, rng);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->logprob, 0.0f);
  EXPECT_TRUE(plain->top_logprobs.empty());

  params.want_logprobs = true;
  Result<SampleResult> sampled_only = sampler.sample(logits, params, {}, {}, rng);
  ASSERT_TRUE(sampled_only.ok());
  EXPECT_EQ(sampled_only->token, 1);
  EXPECT_NEAR(sampled_only->logprob, log_softmax(logits)[1], 1e-6);
  EXPECT_TRUE(sampled_only->top_logprobs.empty());

  params.logprobs = 3;
  Result<SampleResult> top = sampler.sample(logits, params, {}, {}, rng);
  ASSERT_TRUE(top.ok());
  ASSERT_EQ(top->top_logprobs.size(), 3u);
  EXPECT_EQ(top->top_logprobs[0].token, 1);
  EXPECT_EQ(top->top_logprobs[1].token, 2);
  EXPECT_EQ(top->top_logprobs[2].token, 0);
}

TEST(Sampler, DistributionMatchesADoublePrecisionReferenceOnAFullVocabulary) {
  const std::vector<float> logits = random_logits(kQwenVocab, 16);
  struct Case {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
  };
  // Qwen3's defaults; top_p alone over the whole vocabulary (the blockwise sort); a large
  // top_k (the nth_element path) with min_p; everything together.
  for (const Case& c :
       {Case{0.6f, 20, 0.95f, 0.0f}, Case{1.0f, 0, 0.9f, 0.0f}, Case{1.3f, -1, 0.5f, 0.0f},
        Case{1.0f, 5000, 1.0f, 0.01f}, Case{0.8f, 300, 0.7f, 0.02f}, Case{2.0f, 0, 1.0f, 0.0f}}) {
    SCOPED_TRACE("temperature " + std::to_string(c.temperature) + " top_k " +
                 std::to_string(c.top_k) + " top_p " + std::to_string(c.top_p) + " min_p " +
                 std::to_string(c.min_p));
    SamplingParams params = random_params(c.temperature);
    params.top_k = c.top_k;
    params.top_p = c.top_p;
    params.min_p = c.min_p;
    testing::ReferenceDistribution reference =
        reference_distribution(logits, c.temperature, c.top_k, c.top_p, c.min_p);
    ASSERT_GT(reference.margin, 1e-5) << "test data too close to a cut-off";
    Sampler sampler;
    Result<std::vector<TokenProbability>> actual = sampler.distribution(logits, params, {}, {});
    ASSERT_TRUE(actual.ok()) << actual.status().to_string();
    ASSERT_EQ(actual->size(), reference.tokens.size());
    for (size_t i = 0; i < actual->size(); ++i) {
      ASSERT_EQ((*actual)[i].token, reference.tokens[i]);
      ASSERT_NEAR((*actual)[i].probability, reference.probabilities[i],
                  1e-5 * reference.probabilities[i] + 1e-12);
    }
  }
}

TEST(Sampler, BannedIdsAreNeverDrawnAndActLikeAMaskedLogit) {
  const std::vector<float> logits = {3.0f, 2.5f, 2.0f, -kInf, 1.0f};
  const std::vector<int32_t> banned = {0, 2};
  std::vector<float> masked = logits;
  masked[0] = masked[2] = -kInf;
  Sampler sampler;
  SamplerRng with_banned(17);
  SamplerRng with_mask(17);
  for (int i = 0; i < 500; ++i) {
    Result<SampleResult> a = sampler.sample(logits, {}, {}, {}, with_banned, banned);
    Result<SampleResult> b = sampler.sample(masked, {}, {}, {}, with_mask);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_TRUE(a->token == 1 || a->token == 4) << a->token;
    ASSERT_EQ(a->token, b->token);
  }
}

// logit_bias shifts the logits the draw sees (not the raw logprobs), before the penalties, and
// never lifts a banned token.
TEST(Sampler, LogitBiasShiftsLogitsBeforePenaltiesAndNotTheLogprobs) {
  const std::vector<float> logits = {5.0f, 4.9f, 1.0f};
  SamplingParams params = random_params(0.0f);
  params.want_logprobs = true;
  Sampler sampler;
  SamplerRng rng(1);
  params.logit_bias = {{2, 100.0f}};
  Result<SampleResult> lifted = sampler.sample(logits, params, {}, {}, rng);
  ASSERT_TRUE(lifted.ok());
  EXPECT_EQ(lifted->token, 2);
  const double raw_logprob = 1.0 - std::log(std::exp(5.0) + std::exp(4.9) + std::exp(1.0));
  EXPECT_NEAR(lifted->logprob, raw_logprob, 1e-5);
  EXPECT_EQ(sampler.sample(logits, random_params(0.0f), {}, {}, rng)->token, 0);
  params.logit_bias = {{0, -100.0f}};
  EXPECT_EQ(sampler.sample(logits, params, {}, {}, rng)->token, 1);
  // 5 + 1 = 6, then the repetition penalty: 6 / 1.5 = 4 < 4.9.
  params.logit_bias = {{0, 1.0f}};
  params.repetition_penalty = 1.5f;
  EXPECT_EQ(sampler.sample(logits, params, std::vector<int32_t>{0}, {}, rng)->token, 1);
  params.repetition_penalty = 1.0f;
  params.logit_bias = {{2, 100.0f}};
  EXPECT_EQ(sampler.sample(logits, params, {}, {}, rng, std::vector<int32_t>{2})->token, 0);
}

TEST(Sampler, RejectsBadInputWithAClearStatus) {
  Sampler sampler;
  SamplerRng rng(18);
  const SamplingParams params;
  auto message_of = [&](std::vector<float> logits, std::vector<int32_t> prompt,
                        std::vector<int32_t> output, std::vector<int32_t> banned,
                        const SamplingParams& with = SamplingParams()) {
    Result<SampleResult> result = sampler.sample(logits, with, prompt, output, rng, banned);
    EXPECT_FALSE(result.ok());
    if (result.ok()) return std::string();
    EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
    return result.status().message();
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(message_of({0, 1, 2, nan}, {}, {}, {}), "logits[3] is NaN");
  EXPECT_EQ(message_of({kInf, 1}, {}, {}, {}), "logits[0] is +inf");
  EXPECT_EQ(message_of({0, 1}, {0, 2}, {}, {}),
            "prompt_tokens[1] = 2 is outside the vocabulary [0, 2)");
  EXPECT_EQ(message_of({0, 1}, {}, {-1}, {}),
            "output_tokens[0] = -1 is outside the vocabulary [0, 2)");
  EXPECT_EQ(message_of({0, 1}, {}, {}, {5}),
            "banned_token_ids[0] = 5 is outside the vocabulary [0, 2)");
  EXPECT_EQ(message_of({-kInf, -kInf}, {}, {}, {}), "every token is masked: all logits are -inf");
  EXPECT_EQ(message_of({0, 1}, {}, {}, {0, 1}), "every token is masked: all logits are -inf");
  EXPECT_NE(message_of({}, {}, {}, {}).find("logits must hold"), std::string::npos);
  SamplingParams bad = params;
  bad.top_k = -5;
  EXPECT_NE(message_of({0, 1}, {}, {}, {}, bad).find("top_k"), std::string::npos);
  Result<std::vector<TokenProbability>> distribution =
      sampler.distribution(std::vector<float>{nan}, params, {}, {});
  EXPECT_EQ(distribution.status().code(), StatusCode::kInvalidArgument);
}

// A device sampler draws u on the host by sampler_draws and samples with it: that must be
// sample() exactly, generator state included.
TEST(Sampler, SampleWithTheDrawnUnitIsSample) {
  Sampler sampler;
  const std::vector<float> logits = testing::random_logits(500, 21);
  const std::vector<int32_t> prompt = {3, 4, 5};
  for (int n = 0; n < 200; ++n) {
    SamplingParams params;
    params.temperature = n % 4 == 0 ? 0.0f : 0.2f + 0.01f * static_cast<float>(n);
    params.top_k = n % 3 == 0 ? 0 : 1 + n;
    params.top_p = n % 2 == 0 ? 1.0f : 0.5f;
    params.repetition_penalty = n % 5 == 0 ? 1.3f : 1.0f;
    if (n % 7 == 0) params.scripted_output = {9, 8, 7};
    const std::vector<int32_t> output(static_cast<size_t>(n % 5), 11);
    SamplerRng rng(static_cast<uint64_t>(n));
    SamplerRng drawn(static_cast<uint64_t>(n));
    const bool draws = sampler_draws(params, output.size());
    EXPECT_EQ(draws, output.size() >= params.scripted_output.size() &&
                         params.temperature >= kGreedyTemperature);
    const double unit = draws ? drawn.next_unit() : 0.5;
    const SampleResult expected = sampler.sample(logits, params, prompt, output, rng).value();
    const SampleResult got =
        sampler.sample_with_unit(logits, params, prompt, output, unit).value();
    EXPECT_EQ(got.token, expected.token) << "case " << n;
    EXPECT_EQ(rng.state(), drawn.state()) << "case " << n;
  }
}

TEST(Sampler, LogprobsOfAChosenTokenAreThoseSampleReports) {
  Sampler sampler;
  std::vector<float> logits = testing::random_logits(300, 4);
  logits[7] = -std::numeric_limits<float>::infinity();
  SamplingParams params;
  params.want_logprobs = true;
  params.logprobs = 5;
  SamplerRng rng(8);
  const SampleResult sampled = sampler.sample(logits, params, {}, {}, rng).value();
  const SampleResult again = sampler.logprobs(logits, sampled.token, 5).value();
  EXPECT_EQ(again.token, sampled.token);
  EXPECT_EQ(again.logprob, sampled.logprob);
  ASSERT_EQ(again.top_logprobs.size(), sampled.top_logprobs.size());
  for (size_t i = 0; i < again.top_logprobs.size(); ++i) {
    EXPECT_EQ(again.top_logprobs[i].token, sampled.top_logprobs[i].token);
    EXPECT_EQ(again.top_logprobs[i].logprob, sampled.top_logprobs[i].logprob);
  }
  EXPECT_EQ(sampler.logprobs(logits, 300, 5).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(sampler.logprobs(logits, 0, 21).status().code(), StatusCode::kInvalidArgument);
  logits[3] = std::nanf("");
  EXPECT_EQ(sampler.logprobs(logits, 0, 1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve
