// Empirical frequencies of many seeded draws against the expected probabilities, with
// Pearson's chi-square test at significance level 0.001. The seeds are fixed, so each test is
// deterministic; the threshold says how unlikely a correct sampler is to fail it.
#include "common/sampling/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "tests/sampling/test_logits.h"

namespace pdserve {
namespace {

constexpr int kDraws = 200000;
// Sampling a 152k vocabulary costs far more per draw.
constexpr int kFullVocabularyDraws = 10000;

// Upper 0.001 quantiles of the chi-square distribution by degrees of freedom.
double chi_square_critical_0001(size_t degrees_of_freedom) {
  static const std::map<size_t, double> kTable = {
      {1, 10.828},  {2, 13.816},  {3, 16.266},  {4, 18.467},  {5, 20.515},
      {6, 22.458},  {7, 24.322},  {8, 26.124},  {9, 27.877},  {10, 29.588},
      {11, 31.264}, {12, 32.909}, {13, 34.528}, {14, 36.123}, {15, 37.697},
      {16, 39.252}, {17, 40.790}, {18, 42.312}, {19, 43.820}};
  return kTable.at(degrees_of_freedom);
}

// Draws `draws` tokens and checks them against `expected` (token -> probability): no token
// outside it, and a chi-square statistic below the 0.001 critical value.
void expect_frequencies(const std::vector<float>& logits, const SamplingParams& params,
                        const std::map<int32_t, double>& expected, uint64_t seed,
                        int draws = kDraws) {
  Sampler sampler;
  SamplerRng rng(seed);
  std::map<int32_t, int> counts;
  for (int i = 0; i < draws; ++i) {
    Result<SampleResult> result = sampler.sample(logits, params, {}, {}, rng);
    ASSERT_TRUE(result.ok()) << result.status().to_string();
    ASSERT_TRUE(expected.count(result->token)) << "drew excluded token " << result->token;
    ++counts[result->token];
  }
  double chi_square = 0;
  for (const auto& [token, probability] : expected) {
    const double expected_count = probability * draws;
    ASSERT_GE(expected_count, 5.0) << "too few draws for a chi-square test on token " << token;
    const double difference = counts[token] - expected_count;
    chi_square += difference * difference / expected_count;
  }
  EXPECT_LT(chi_square, chi_square_critical_0001(expected.size() - 1))
      << "over " << expected.size() << " tokens";
}

// Logits whose softmax is exactly `probabilities` (up to float rounding).
std::vector<float> logits_of(const std::vector<double>& probabilities) {
  std::vector<float> logits;
  for (double p : probabilities) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

// Renormalised restriction of `probabilities` to `tokens`.
std::map<int32_t, double> restricted(const std::vector<double>& probabilities,
                                     const std::vector<int32_t>& tokens) {
  double total = 0;
  for (int32_t token : tokens) total += probabilities[token];
  std::map<int32_t, double> result;
  for (int32_t token : tokens) result[token] = probabilities[token] / total;
  return result;
}

const std::vector<double> kProbabilities = {0.05, 0.10, 0.15, 0.20, 0.25, 0.125, 0.075, 0.05};

TEST(SamplerDistribution, PlainSamplingMatchesTheSoftmax) {
  expect_frequencies(logits_of(kProbabilities), SamplingParams{},
                     restricted(kProbabilities, {0, 1, 2, 3, 4, 5, 6, 7}), 101);
}

TEST(SamplerDistribution, TemperatureSharpensAsPowers) {
  // softmax(log p / 0.5) is p^2 renormalised.
  std::vector<double> squared;
  for (double p : kProbabilities) squared.push_back(p * p);
  SamplingParams params;
  params.temperature = 0.5f;
  expect_frequencies(logits_of(kProbabilities), params,
                     restricted(squared, {0, 1, 2, 3, 4, 5, 6, 7}), 102);
}

TEST(SamplerDistribution, TopKRenormalisesTheKBest) {
  SamplingParams params;
  params.top_k = 3;
  expect_frequencies(logits_of(kProbabilities), params, restricted(kProbabilities, {2, 3, 4}), 103);
}

TEST(SamplerDistribution, TopPRenormalisesTheSmallestSufficientPrefix) {
  // Sorted: 0.25, 0.20, 0.15 (sum 0.60 >= 0.55, while 0.45 is not).
  SamplingParams params;
  params.top_p = 0.55f;
  expect_frequencies(logits_of(kProbabilities), params, restricted(kProbabilities, {2, 3, 4}), 104);
}

TEST(SamplerDistribution, MinPKeepsTokensAboveTheScaledMaximum) {
  // 0.45 * 0.25 = 0.1125: keeps 0.15, 0.20, 0.25 and 0.125.
  SamplingParams params;
  params.min_p = 0.45f;
  expect_frequencies(logits_of(kProbabilities), params, restricted(kProbabilities, {2, 3, 4, 5}),
                     105);
}

TEST(SamplerDistribution, TopKThenTopPOnTheTruncatedMass) {
  // top_k 5 keeps 0.25, 0.20, 0.15, 0.125, 0.10 (mass 0.825); renormalised the prefix sums are
  // 0.303, 0.545, 0.727, so top_p 0.7 keeps three tokens, where on the full distribution it
  // would have kept four (0.25 + 0.20 + 0.15 + 0.125 = 0.725).
  SamplingParams params;
  params.top_k = 5;
  params.top_p = 0.7f;
  expect_frequencies(logits_of(kProbabilities), params, restricted(kProbabilities, {2, 3, 4}), 106);
}

TEST(SamplerDistribution, DrawsFollowTheReportedDistributionOnAFullVocabulary) {
  // Qwen3's default settings on a realistic vocabulary: the draws must follow the
  // distribution() the sampler reports, which the sampler tests check against a reference.
  // A flatter spread (scale 0.5) than the other tests, so that most of the 20 tokens of top_k
  // survive top_p.
  const std::vector<float> logits = testing::random_logits(151936, 107, 0.5);
  SamplingParams params;
  params.temperature = 0.6f;
  params.top_k = 20;
  params.top_p = 0.95f;
  Sampler sampler;
  Result<std::vector<TokenProbability>> distribution = sampler.distribution(logits, params, {}, {});
  ASSERT_TRUE(distribution.ok());
  std::map<int32_t, double> expected;
  for (const TokenProbability& entry : *distribution) expected[entry.token] = entry.probability;
  ASSERT_GE(expected.size(), 10u) << "the test data should leave many tokens after top_p";
  expect_frequencies(logits, params, expected, 108, kFullVocabularyDraws);
}

}  // namespace
}  // namespace pdserve
