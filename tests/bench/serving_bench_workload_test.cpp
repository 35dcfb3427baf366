// pdserve-bench-serving's workloads: uniform and ShareGPT-like lengths, JSONL prompt files and
// gamma arrivals (vLLM's --burstiness).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "bench/serving/latency_stats.h"
#include "bench/serving/prompt_file.h"
#include "bench/serving/workload.h"

namespace pdserve::bench {
namespace {

namespace fs = std::filesystem;

TEST(Workload, LengthsPrefixAndDeterminism) {
  WorkloadOptions options;
  options.num_prompts = 200;
  options.input_len = 100;
  options.output_len = 20;
  options.range_ratio = 0.5;
  options.shared_prefix_len = 30;
  options.vocab_size = 1000;
  options.seed = 3;
  const Result<std::vector<BenchRequest>> requests = make_workload(options);
  ASSERT_TRUE(requests.ok()) << requests.status().to_string();
  ASSERT_EQ(requests->size(), 200u);
  int shortest = 1 << 30, longest = 0;
  for (const BenchRequest& request : *requests) {
    const int unique = static_cast<int>(request.prompt.size()) - 30;
    shortest = std::min(shortest, unique);
    longest = std::max(longest, unique);
    EXPECT_GE(request.output_len, 10);
    EXPECT_LE(request.output_len, 30);
    EXPECT_TRUE(std::equal(request.prompt.begin(), request.prompt.begin() + 30,
                           (*requests)[0].prompt.begin()));
    for (int32_t id : request.prompt) ASSERT_TRUE(id >= 0 && id < 1000);
    EXPECT_EQ(request.arrival_s, 0.0);  // rate inf: all at once
  }
  EXPECT_GE(shortest, 50);
  EXPECT_LE(longest, 150);
  EXPECT_LT(shortest, 60);  // 200 uniform draws over [50, 150] reach both ends
  EXPECT_GT(longest, 140);
  // The unique parts differ (no accidental sharing beyond the prefix).
  EXPECT_NE((*requests)[0].prompt[30], (*requests)[1].prompt[30]);

  const Result<std::vector<BenchRequest>> again = make_workload(options);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[7].prompt, (*requests)[7].prompt);
}

TEST(Workload, PoissonArrivalsHaveTheRequestedRate) {
  WorkloadOptions options;
  options.num_prompts = 4000;
  options.input_len = 1;
  options.output_len = 1;
  options.request_rate = 8;
  const Result<std::vector<BenchRequest>> requests = make_workload(options);
  ASSERT_TRUE(requests.ok());
  for (size_t i = 1; i < requests->size(); ++i) {
    ASSERT_GE((*requests)[i].arrival_s, (*requests)[i - 1].arrival_s);
  }
  // Mean gap 1/8 s; the standard error of the mean of 3999 exponential gaps is 1/8/sqrt(3999).
  const double mean_gap = requests->back().arrival_s / 3999;
  EXPECT_NEAR(mean_gap, 0.125, 5 * 0.125 / std::sqrt(3999.0));
}

TEST(Workload, RejectsBadOptions) {
  WorkloadOptions options;
  options.range_ratio = 1.0;
  EXPECT_EQ(make_workload(options).status().code(), StatusCode::kInvalidArgument);
  options = {};
  options.request_rate = 0;
  EXPECT_EQ(make_workload(options).status().code(), StatusCode::kInvalidArgument);
}

// The log-normal lengths against their documented parameters: with no effective clip, the
// mean and standard deviation of ln(length) over 20000 draws are mu and sigma within ~4
// standard errors (plus the rounding to whole tokens).
TEST(Workload, ShareGptSyntheticLengthsFollowTheDocumentedLogNormal) {
  WorkloadOptions options;
  options.num_prompts = 20000;
  options.lengths = LengthDistribution::kShareGptSynthetic;
  options.max_input_len = 1 << 24;
  options.max_output_len = 1 << 24;
  options.vocab_size = 100;
  options.seed = 11;
  const Result<std::vector<BenchRequest>> requests = make_workload(options);
  ASSERT_TRUE(requests.ok()) << requests.status().to_string();
  const auto log_moments = [&](auto length_of) {
    double sum = 0, sum_sq = 0;
    for (const BenchRequest& request : *requests) {
      const double x = std::log(static_cast<double>(length_of(request)));
      sum += x;
      sum_sq += x * x;
    }
    const double n = static_cast<double>(requests->size());
    const double mean = sum / n;
    return std::pair{mean, std::sqrt(sum_sq / n - mean * mean)};
  };
  const auto [input_mu, input_sigma] =
      log_moments([](const BenchRequest& r) { return r.prompt.size(); });
  EXPECT_NEAR(input_mu, kShareGptInputLogMean, 0.04);
  EXPECT_NEAR(input_sigma, kShareGptInputLogSigma, 0.04);
  const auto [output_mu, output_sigma] =
      log_moments([](const BenchRequest& r) { return r.output_len; });
  EXPECT_NEAR(output_mu, kShareGptOutputLogMean, 0.04);
  EXPECT_NEAR(output_sigma, kShareGptOutputLogSigma, 0.04);
}

// Clipping: every length is within [1, max]; the share at the clip is P(X >= max - 0.5) of the
// log-normal (0.376 for the input at 256, 0.123 for the output at 512), within 4 standard errors.
TEST(Workload, ShareGptSyntheticLengthsAreClippedAndSeeded) {
  WorkloadOptions options;
  options.num_prompts = 10000;
  options.lengths = LengthDistribution::kShareGptSynthetic;
  options.max_input_len = 256;
  options.max_output_len = 512;
  options.shared_prefix_len = 4;
  options.vocab_size = 100;
  options.seed = 5;
  const Result<std::vector<BenchRequest>> requests = make_workload(options);
  ASSERT_TRUE(requests.ok()) << requests.status().to_string();
  int input_at_clip = 0, output_at_clip = 0;
  for (const BenchRequest& request : *requests) {
    const int unique = static_cast<int>(request.prompt.size()) - 4;
    ASSERT_GE(unique, 1);
    ASSERT_LE(unique, 256);
    ASSERT_GE(request.output_len, 1);
    ASSERT_LE(request.output_len, 512);
    input_at_clip += unique == 256;
    output_at_clip += request.output_len == 512;
  }
  const auto tail = [](double max_len, double mu, double sigma) {
    return 0.5 * std::erfc((std::log(max_len - 0.5) - mu) / sigma / std::sqrt(2.0));
  };
  const auto expect_share = [](int count, double p) {
    EXPECT_NEAR(count / 10000.0, p, 4 * std::sqrt(p * (1 - p) / 10000.0)) << p;
  };
  expect_share(input_at_clip, tail(256, kShareGptInputLogMean, kShareGptInputLogSigma));
  expect_share(output_at_clip, tail(512, kShareGptOutputLogMean, kShareGptOutputLogSigma));

  const Result<std::vector<BenchRequest>> again = make_workload(options);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[42].prompt, (*requests)[42].prompt);
  EXPECT_EQ((*again)[42].output_len, (*requests)[42].output_len);
  options.seed = 6;
  EXPECT_NE(make_workload(options)->front().prompt, requests->front().prompt);
}

TEST(PromptFile, ReadsIdAndTextPromptsWithDefaultOutputLength) {
  const std::string text =
      "{\"prompt\": [1, 2, 3], \"output_len\": 7}\n"
      "\n"
      "{\"prompt\": \"Hello there\"}\r\n"
      "{\"output_len\": 2, \"prompt\": [151643]}";
  const Result<std::vector<BenchRequest>> requests = parse_prompt_lines(text, "p.jsonl", 16);
  ASSERT_TRUE(requests.ok()) << requests.status().to_string();
  ASSERT_EQ(requests->size(), 3u);
  EXPECT_EQ((*requests)[0].prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE((*requests)[0].prompt_text.empty());
  EXPECT_EQ((*requests)[0].output_len, 7);
  EXPECT_TRUE((*requests)[1].prompt.empty());
  EXPECT_EQ((*requests)[1].prompt_text, "Hello there");
  EXPECT_EQ((*requests)[1].output_len, 16);
  EXPECT_EQ((*requests)[2].prompt, (std::vector<int32_t>{151643}));
  EXPECT_EQ((*requests)[2].output_len, 2);
}

TEST(PromptFile, BadLinesAreNamedByNumber) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"{\"prompt\": [1]}\nnot json\n", "p.jsonl:2: not a JSON value"},
      {"[{\"prompt\": [1]}, {\"prompt\": [2]}]", "p.jsonl:1: expected a JSON object"},
      {"{\"prompt\": [1]}\n\n{\"text\": \"x\"}\n", "p.jsonl:3: missing \"prompt\""},
      {"{\"prompt\": [1, -4]}", "p.jsonl:1: \"prompt\"[1] is not a token id (-4)"},
      {"{\"prompt\": [1, 2.5]}", "\"prompt\"[1] is not a token id (2.5)"},
      {"{\"prompt\": [4294967296]}", "is not a token id"},
      {"{\"prompt\": []}", "p.jsonl:1: \"prompt\" is an empty array"},
      {"{\"prompt\": \"\"}", "\"prompt\" is an empty string"},
      {"{\"prompt\": 12}", "must be a string or an array"},
      {"{\"prompt\": [1], \"output_len\": 0}", "\"output_len\" must be an integer"},
      {"{\"prompt\": [1], \"output_len\": \"5\"}", "\"output_len\" must be an integer"},
      {"{\"prompt\": [1]} {\"prompt\": [2]}", "p.jsonl:1: not a JSON value"},
      {"\n  \n", "p.jsonl: no prompts"},
  };
  for (const Case& c : cases) {
    const Result<std::vector<BenchRequest>> requests = parse_prompt_lines(c.text, "p.jsonl", 4);
    ASSERT_FALSE(requests.ok()) << c.text;
    EXPECT_EQ(requests.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(requests.status().message().find(c.message), std::string::npos)
        << c.text << " -> " << requests.status().message();
  }
  EXPECT_FALSE(read_prompt_file("/nonexistent/prompts.jsonl", 4).ok());
}

// A file workload takes the first --num-prompts lines, in order, with seeded Poisson arrivals.
TEST(PromptFile, WorkloadTakesTheFirstPromptsWithArrivals) {
  const fs::path path =
      fs::temp_directory_path() / ("bench_prompts_" + std::to_string(getpid()) + ".jsonl");
  {
    std::ofstream file(path);
    for (int i = 1; i <= 5; ++i) file << "{\"prompt\": [" << i << "]}\n";
  }
  WorkloadOptions options;
  options.dataset_path = path.string();
  options.num_prompts = 3;
  options.output_len = 9;
  options.request_rate = 2;
  const Result<std::vector<BenchRequest>> requests = make_workload(options);
  fs::remove(path);
  ASSERT_TRUE(requests.ok()) << requests.status().to_string();
  ASSERT_EQ(requests->size(), 3u);
  EXPECT_EQ(dataset_name(options), "file");
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ((*requests)[i].prompt, std::vector<int32_t>{i + 1});
    EXPECT_EQ((*requests)[i].output_len, 9);
  }
  EXPECT_EQ((*requests)[0].arrival_s, 0.0);
  EXPECT_GT((*requests)[2].arrival_s, (*requests)[1].arrival_s);
}

// ---- Arrivals: vLLM's --burstiness -------------------------------------------------------------

// Gaps are gamma(shape k = burstiness, scale 1 / (rate k)): mean 1/rate, variance 1/(rate^2 k).
// Over n gaps the sample mean's standard error is sqrt(var / n) and the sample variance's is
// var * sqrt((2 + 6 / k) / n) (a gamma's excess kurtosis is 6 / k); both within 5 of them.
TEST(Workload, GammaArrivalGapsHaveTheMeanAndVarianceOfTheirShape) {
  constexpr double kRate = 8;
  constexpr int kGaps = 20000;
  for (double burstiness : {0.25, 1.0, 4.0}) {
    WorkloadOptions options;
    options.num_prompts = kGaps + 1;
    options.input_len = 1;
    options.output_len = 1;
    options.vocab_size = 10;
    options.request_rate = kRate;
    options.burstiness = burstiness;
    options.seed = 17;
    const Result<std::vector<BenchRequest>> requests = make_workload(options);
    ASSERT_TRUE(requests.ok()) << requests.status().to_string();
    double sum = 0, sum_sq = 0;
    for (size_t i = 1; i < requests->size(); ++i) {
      const double gap = (*requests)[i].arrival_s - (*requests)[i - 1].arrival_s;
      ASSERT_GE(gap, 0.0);
      sum += gap;
      sum_sq += gap * gap;
    }
    const double mean = sum / kGaps;
    const double variance = sum_sq / kGaps - mean * mean;
    const double expected_variance = 1 / (kRate * kRate * burstiness);
    EXPECT_NEAR(mean, 1 / kRate, 5 * std::sqrt(expected_variance / kGaps)) << burstiness;
    EXPECT_NEAR(variance, expected_variance,
                5 * expected_variance * std::sqrt((2 + 6 / burstiness) / kGaps))
        << burstiness;
    EXPECT_EQ((*requests)[0].arrival_s, 0.0);
    EXPECT_EQ(make_workload(options).value()[kGaps].arrival_s, requests->back().arrival_s);
  }
}

TEST(Workload, BurstinessMustBePositive) {
  for (double burstiness : {0.0, -1.0, std::numeric_limits<double>::infinity()}) {
    WorkloadOptions options;
    options.burstiness = burstiness;
    const Result<std::vector<BenchRequest>> requests = make_workload(options);
    EXPECT_EQ(requests.status().code(), StatusCode::kInvalidArgument) << burstiness;
    EXPECT_NE(requests.status().message().find("--burstiness"), std::string::npos);
  }
}

}  // namespace
}  // namespace pdserve::bench
