// Tests of pdserve-bench-serving: percentile math against numpy's values, the workload's
// properties (uniform and ShareGPT-like lengths, JSONL prompt files, vLLM's ShareGPT JSON and
// length filter, gamma arrivals), vLLM's --goodput / --percentile-metrics / --metric-percentiles
// and result keys, flag validation (exit 2, before any request), failures of a server that dies
// or stalls mid-stream, a server timeline copied into the JSON, multi-turn conversations (the
// workload, and the history each turn sends to a fake server), and live runs against
// pdserve-decode on the tiny model: exact token counts, a --result-json whose per-request
// records reproduce its summary, ShareGPT on /v1/completions and /v1/chat/completions, and
// multi-turn conversations whose prompts grow turn by turn.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/buffers_iterator.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>

#include "bench/serving/latency_stats.h"
#include "bench/serving/prompt_file.h"
#include "bench/serving/serving_benchmark.h"
#include "bench/serving/sharegpt_dataset.h"
#include "bench/serving/workload.h"
#include "common/core/files.h"
#include "common/tokenizer/tokenizer.h"

namespace pdserve::bench {
namespace {

namespace fs = std::filesystem;
using tcp = boost::asio::ip::tcp;

// Expected values from numpy 1.24: np.mean and np.percentile(a, q) (linear interpolation).
TEST(LatencyStats, MatchesNumpyPercentiles) {
  const std::vector<double> five = {15, 20, 35, 40, 50};
  const LatencySummary summary = summarize(five);
  EXPECT_EQ(summary.count, 5u);
  EXPECT_DOUBLE_EQ(summary.mean, 32.0);
  EXPECT_DOUBLE_EQ(summary.p50, 35.0);
  EXPECT_DOUBLE_EQ(summary.p90, 46.0);
  EXPECT_NEAR(summary.p99, 49.6, 1e-12);
  EXPECT_DOUBLE_EQ(summary.max, 50.0);

  const std::vector<double> shuffled = {7, 3, 10, 1, 9, 2, 8, 4, 6, 5};
  EXPECT_DOUBLE_EQ(percentile(shuffled, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(shuffled, 50), 5.5);
  EXPECT_NEAR(percentile(shuffled, 90), 9.1, 1e-12);
  EXPECT_NEAR(percentile(shuffled, 99), 9.91, 1e-12);
  EXPECT_DOUBLE_EQ(percentile(shuffled, 100), 10.0);
  EXPECT_DOUBLE_EQ(summarize(shuffled).mean, 5.5);
}

TEST(LatencyStats, SingleAndEmptySamples) {
  const std::vector<double> one = {4.0};
  EXPECT_DOUBLE_EQ(summarize(one).p50, 4.0);
  EXPECT_DOUBLE_EQ(summarize(one).p99, 4.0);
  const LatencySummary empty = summarize({});
  EXPECT_EQ(empty.count, 0u);
  EXPECT_DOUBLE_EQ(empty.p99, 0.0);
}

RequestOutcome completed(double start_s, double ttft_s, double e2e_s, int output_tokens) {
  RequestOutcome outcome;
  outcome.success = true;
  outcome.prompt_tokens = 10;
  outcome.output_tokens = output_tokens;
  outcome.start_s = start_s;
  outcome.ttft_s = ttft_s;
  outcome.e2e_s = e2e_s;
  return outcome;
}

TEST(Summary, ThroughputTpotAndGoodputOfKnownOutcomes) {
  BenchmarkResult result;
  // TPOT = (E2E - TTFT) / (tokens - 1): 100 ms, 300 ms, none (one token).
  result.outcomes = {completed(0, 0.2, 1.2, 11), completed(0.5, 0.5, 3.5, 11),
                     completed(2, 0.1, 0.1, 1)};
  RequestOutcome failed;
  failed.error = "HTTP 500";
  failed.start_s = 2;
  failed.e2e_s = 2;  // ends at 4 s, after every completed request
  result.outcomes.push_back(failed);
  summarize_outcomes(result, Slo{.ttft_ms = 400, .tpot_ms = 200});
  EXPECT_EQ(result.completed, 3);
  EXPECT_EQ(result.failed, 1);
  EXPECT_DOUBLE_EQ(result.duration_s, 4.0);
  EXPECT_EQ(result.total_output_tokens, 23);
  EXPECT_DOUBLE_EQ(result.output_throughput, 23 / 4.0);
  EXPECT_DOUBLE_EQ(result.request_throughput, 3 / 4.0);
  EXPECT_EQ(result.tpot_ms.count, 2u);
  EXPECT_NEAR(result.tpot_ms.mean, 200.0, 1e-9);
  EXPECT_NEAR(result.ttft_ms.p50, 200.0, 1e-9);
  // Good: the first (TTFT 200, TPOT 100) and the one-token request (TTFT 100, no TPOT); the
  // second misses both objectives.
  EXPECT_EQ(result.good, 2);
  EXPECT_DOUBLE_EQ(result.goodput, 2 / 4.0);
  EXPECT_NE(format_report(result, Slo{.ttft_ms = 400}).find("Request goodput"), std::string::npos);
  EXPECT_EQ(format_report(result).find("Request goodput"), std::string::npos);

  summarize_outcomes(result, Slo{.tpot_ms = 350});  // recomputed, TPOT only
  EXPECT_EQ(result.completed, 3);
  EXPECT_EQ(result.good, 3);
}

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

// ---- vLLM's ShareGPT dataset -------------------------------------------------------------------

const fs::path kShareGptFixture = fs::path(PDSERVE_BENCH_DATA_DIR) / "sharegpt_small.json";
const fs::path kQwen3Tokenizer = fs::path(PDSERVE_ASSETS_DIR) / "qwen3-tokenizer";

std::vector<ShareGptConversation> fixture_conversations() {
  const Result<std::string> text = read_text_file(kShareGptFixture);
  EXPECT_TRUE(text.ok()) << text.status().to_string();
  Result<std::vector<ShareGptConversation>> conversations =
      parse_sharegpt(text.ok() ? *text : "[]", kShareGptFixture.string());
  EXPECT_TRUE(conversations.ok()) << conversations.status().to_string();
  return conversations.ok() ? *conversations : std::vector<ShareGptConversation>{};
}

Tokenizer qwen3_tokenizer() {
  return Tokenizer::from_model_dir(kQwen3Tokenizer).value();
}

// Token counts of the fixture's first two turns by Hugging Face tokenizers 0.23.3 on
// configs/models/qwen3-tokenizer/tokenizer.json (add_special_tokens=True adds none for Qwen3),
// the oracle of which conversations vLLM keeps and of their output lengths.
struct FixtureConversation {
  const char* prompt_start;
  int prompt_tokens;
  int reply_tokens;
};
constexpr FixtureConversation kFixtureCounts[] = {
    {"What should I plant", 14, 38},           // kept
    {"Hi!", 2, 22},                            // prompt < 4
    {"Can you tell me whether", 12, 2},        // reply < 4
    {"Why did my sourdough", 13, 35},          // kept (its later turns are not used)
    {"Please add up all", 1905, 20},           // prompt > 1024
    {"Here is a list of numbers", 472, 2263},  // prompt + reply > 2048
    {"Wie viele Tage", 21, 46},                // kept
    {"Welcome back!", 12, 21},                 // kept: vLLM's prompt is the first turn, any role
};

TEST(ShareGpt, ParseKeepsEveryConversationWithTwoTurnsInFileOrder) {
  const std::vector<ShareGptConversation> conversations = fixture_conversations();
  // 10 entries; the one with a single turn and the one without "conversations" are skipped.
  ASSERT_EQ(conversations.size(), std::size(kFixtureCounts));
  for (size_t i = 0; i < conversations.size(); ++i) {
    EXPECT_TRUE(conversations[i].prompt.starts_with(kFixtureCounts[i].prompt_start))
        << conversations[i].prompt;
  }
  EXPECT_TRUE(conversations[3].reply.starts_with("Usually the starter")) << conversations[3].reply;
  EXPECT_EQ(conversations[7].reply.substr(0, 13), "Right, I stil");
}

TEST(ShareGpt, LengthFilterMatchesVllmsBounds) {
  EXPECT_TRUE(passes_vllm_length_filter(4, 4, false));
  EXPECT_FALSE(passes_vllm_length_filter(3, 100, false));
  EXPECT_FALSE(passes_vllm_length_filter(100, 3, false));
  EXPECT_TRUE(passes_vllm_length_filter(100, 3, true));  // a fixed output length skips that check
  EXPECT_FALSE(passes_vllm_length_filter(3, 100, true));
  EXPECT_TRUE(passes_vllm_length_filter(1024, 1024, false));
  EXPECT_FALSE(passes_vllm_length_filter(1025, 4, false));
  EXPECT_FALSE(passes_vllm_length_filter(1000, 1049, false));
  EXPECT_TRUE(passes_vllm_length_filter(1000, 1048, false));
}

// The oracle: kFixtureCounts run through vLLM's rule, in file order (shuffle off).
std::vector<std::pair<std::string, int>> expected_survivors(std::optional<int> fixed_output) {
  std::vector<std::pair<std::string, int>> survivors;
  for (const FixtureConversation& c : kFixtureCounts) {
    const int output_len = fixed_output.value_or(c.reply_tokens);
    if (passes_vllm_length_filter(c.prompt_tokens, output_len, fixed_output.has_value())) {
      survivors.emplace_back(c.prompt_start, output_len);
    }
  }
  return survivors;
}

std::vector<std::pair<std::string, int>> sampled(const std::vector<BenchRequest>& requests,
                                                 const std::vector<ShareGptConversation>& all) {
  std::vector<std::pair<std::string, int>> out;
  for (const BenchRequest& request : requests) {
    EXPECT_TRUE(request.prompt.empty());  // sent as text, the server counts its tokens
    std::string start;
    for (size_t i = 0; i < all.size(); ++i) {
      if (all[i].prompt == request.prompt_text) start = kFixtureCounts[i].prompt_start;
    }
    out.emplace_back(start, request.output_len);
  }
  return out;
}

TEST(ShareGpt, SamplingKeepsWhatVllmKeepsWithTheReplysTokenCount) {
  const std::vector<ShareGptConversation> all = fixture_conversations();
  const Tokenizer tokenizer = qwen3_tokenizer();
  ShareGptSource source;
  source.shuffle = false;
  source.oversample = false;
  const Result<std::vector<BenchRequest>> natural = sample_sharegpt(all, tokenizer, source, 100, 0);
  ASSERT_TRUE(natural.ok()) << natural.status().to_string();
  EXPECT_EQ(expected_survivors(std::nullopt).size(), 4u);
  EXPECT_EQ(sampled(*natural, all), expected_survivors(std::nullopt));

  // --sharegpt-output-len: every request asks for it; short replies no longer drop a pair, long
  // ones no longer count towards the total.
  source.output_len = 8;
  const Result<std::vector<BenchRequest>> fixed = sample_sharegpt(all, tokenizer, source, 100, 0);
  ASSERT_TRUE(fixed.ok()) << fixed.status().to_string();
  EXPECT_EQ(expected_survivors(8).size(), 6u);
  EXPECT_EQ(sampled(*fixed, all), expected_survivors(8));

  // The first num_prompts that pass, in order.
  source.output_len.reset();
  const Result<std::vector<BenchRequest>> two = sample_sharegpt(all, tokenizer, source, 2, 0);
  ASSERT_TRUE(two.ok());
  const auto survivors = expected_survivors(std::nullopt);
  EXPECT_EQ(sampled(*two, all), decltype(survivors)(survivors.begin(), survivors.begin() + 2));
}

TEST(ShareGpt, ShuffleAndOversampleAreSeeded) {
  const std::vector<ShareGptConversation> all = fixture_conversations();
  const Tokenizer tokenizer = qwen3_tokenizer();
  auto survivors = expected_survivors(std::nullopt);
  std::sort(survivors.begin(), survivors.end());
  ShareGptSource source;
  std::set<std::vector<std::pair<std::string, int>>> orders;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const Result<std::vector<BenchRequest>> requests =
        sample_sharegpt(all, tokenizer, source, 10, seed);
    ASSERT_TRUE(requests.ok()) << requests.status().to_string();
    ASSERT_EQ(requests->size(), 10u);  // oversampled from the 4 that pass
    auto picked = sampled(*requests, all);
    // The first four are the survivors in a shuffled order, the rest repeats of them.
    std::vector<std::pair<std::string, int>> first(picked.begin(), picked.begin() + 4);
    orders.insert(first);
    std::sort(first.begin(), first.end());
    EXPECT_EQ(first, survivors) << seed;
    for (const auto& repeat : picked) {
      EXPECT_TRUE(std::binary_search(survivors.begin(), survivors.end(), repeat)) << repeat.first;
    }
    EXPECT_EQ(sampled(sample_sharegpt(all, tokenizer, source, 10, seed).value(), all), picked);
  }
  EXPECT_GT(orders.size(), 5u);  // 20 seeds over 24 orders: shuffled, not fixed

  source.oversample = false;
  EXPECT_EQ(sample_sharegpt(all, tokenizer, source, 10, 3).value().size(), 4u);
}

TEST(ShareGpt, MalformedFilesAreRefusedNamingTheEntry) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"[{\"conversations\": []}", "s.json: not a JSON document"},
      {"{\"conversations\": []}", "s.json: expected a JSON array"},
      {"[{\"conversations\": []}, 7]", "s.json: entry 1: not a JSON object"},
      {"[{\"conversations\": {\"from\": \"human\"}}]",
       "entry 0: \"conversations\" is not an array"},
      {"[{\"conversations\": [{\"from\": \"human\", \"value\": \"hello there\"}, {\"from\": "
       "\"gpt\"}]}]",
       "entry 0: conversations[1] has no string \"value\""},
      {"[{\"conversations\": [{\"value\": 3}, {\"value\": \"x\"}]}]",
       "entry 0: conversations[0] has no string \"value\""},
      {"[{\"conversations\": [\"hi\", \"there\"]}]", "conversations[0] is not a JSON object"},
  };
  for (const Case& c : cases) {
    const Result<std::vector<ShareGptConversation>> parsed = parse_sharegpt(c.text, "s.json");
    ASSERT_FALSE(parsed.ok()) << c.text;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(c.message), std::string::npos)
        << c.text << " -> " << parsed.status().message();
  }
  // Well-formed but nothing usable: vLLM would have nothing to send either.
  const Result<std::vector<ShareGptConversation>> too_short =
      parse_sharegpt("[{\"conversations\": [{\"value\": \"Hi\"}, {\"value\": \"Yo\"}]}]", "s.json");
  ASSERT_TRUE(too_short.ok());
  ShareGptSource source;
  source.path = "s.json";
  const Result<std::vector<BenchRequest>> none =
      sample_sharegpt(*too_short, qwen3_tokenizer(), source, 5, 0);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no conversation passes"), std::string::npos);
}

TEST(ShareGpt, WorkloadReadsTheFileWithTheTokenizerAndAssignsArrivals) {
  WorkloadOptions options;
  options.sharegpt.path = kShareGptFixture.string();
  options.sharegpt.tokenizer_path = (kQwen3Tokenizer / "tokenizer.json").string();
  options.sharegpt.shuffle = false;
  options.num_prompts = 6;
  options.request_rate = 5;
  const Result<std::vector<BenchRequest>> requests = make_workload(options);
  ASSERT_TRUE(requests.ok()) << requests.status().to_string();
  EXPECT_EQ(dataset_name(options), "sharegpt");
  ASSERT_EQ(requests->size(), 6u);
  EXPECT_EQ((*requests)[0].output_len, 38);
  EXPECT_EQ((*requests)[0].arrival_s, 0.0);
  EXPECT_GT((*requests)[5].arrival_s, (*requests)[4].arrival_s);

  options.sharegpt.tokenizer_path.clear();
  EXPECT_NE(make_workload(options).status().message().find("--tokenizer"), std::string::npos);
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

// ---- vLLM's --goodput, --percentile-metrics, --metric-percentiles and result keys -------------

TEST(VllmOptions, GoodputItemsAsVllmTakesThem) {
  const Result<Slo> separate = parse_goodput({"ttft:500", "tpot:50"});
  ASSERT_TRUE(separate.ok()) << separate.status().to_string();
  EXPECT_EQ(separate->ttft_ms, 500.0);
  EXPECT_EQ(separate->tpot_ms, 50.0);
  EXPECT_FALSE(separate->e2el_ms.has_value());
  const Result<Slo> quoted = parse_goodput({"ttft:500 tpot:2.5  e2el:0"});
  ASSERT_TRUE(quoted.ok()) << quoted.status().to_string();
  EXPECT_EQ(quoted->tpot_ms, 2.5);
  EXPECT_EQ(quoted->e2el_ms, 0.0);  // vLLM accepts any objective >= 0

  const std::vector<std::vector<std::string>> bad = {
      {"ttft"},      {"ttft:"},  {"ttft:abc"},         {"ttft:-1"}, {"ttft:1:2"},
      {"latency:5"}, {"TTFT:5"}, {"ttft:1", "ttft:2"}, {""},        {"ttft:inf"}};
  for (const std::vector<std::string>& items : bad) {
    const Result<Slo> slo = parse_goodput(items);
    EXPECT_EQ(slo.status().code(), StatusCode::kInvalidArgument) << items[0];
    EXPECT_NE(slo.status().message().find("--goodput"), std::string::npos) << items[0];
  }
}

TEST(Summary, GoodputWithAnEndToEndObjective) {
  BenchmarkResult result;
  result.outcomes = {completed(0, 0.2, 1.2, 11), completed(0.5, 0.5, 3.5, 11),
                     completed(2, 0.1, 0.1, 1)};
  summarize_outcomes(result, Slo{.e2el_ms = 1500});
  EXPECT_EQ(result.good, 2);  // E2E 1200 and 100 ms are within, 3500 is not
  summarize_outcomes(result, Slo{.ttft_ms = 0});
  EXPECT_EQ(result.good, 0);  // an objective of 0 ms: no request's TTFT is within it
  summarize_outcomes(result, Slo{.ttft_ms = 300, .e2el_ms = 1500});
  EXPECT_EQ(result.good, 2);
}

TEST(VllmOptions, PercentileMetricsAndKeyNames) {
  EXPECT_EQ(parse_percentile_metrics("ttft,e2el").value(),
            (std::vector<std::string>{"ttft", "e2el"}));
  for (const char* bad : {"ttft,foo", "client_queue_time", "", "ttft,,itl", "TTFT"}) {
    EXPECT_EQ(parse_percentile_metrics(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(parse_metric_percentiles("50,90,99.9").value(), (std::vector<double>{50, 90, 99.9}));
  for (const char* bad : {"101", "-1", "abc", "", "99,", "nan", "50;90"}) {
    EXPECT_EQ(parse_metric_percentiles(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  // Python's str(): whole numbers without ".0", others as printed.
  EXPECT_EQ(percentile_key_name(99), "99");
  EXPECT_EQ(percentile_key_name(50.0), "50");
  EXPECT_EQ(percentile_key_name(100), "100");
  EXPECT_EQ(percentile_key_name(0), "0");
  EXPECT_EQ(percentile_key_name(99.9), "99.9");
  EXPECT_EQ(percentile_key_name(99.99), "99.99");
  EXPECT_EQ(percentile_key_name(0.5), "0.5");
  EXPECT_EQ(percentile_key_name(0.0001), "0.0001");
  EXPECT_EQ(percentile_key_name(1e-05), "1e-05");
}

// vLLM's keys on known outcomes. Expected values from numpy 1.24: TTFTs 15, 20, 35, 40, 50 ms
// have np.mean 32, np.median 35, np.std 12.884098726725126, np.percentile(., 99.9) 49.96.
TEST(ResultJson, VllmKeysOfKnownOutcomes) {
  BenchmarkResult result;
  result.model = "m";
  const double ttfts[] = {0.015, 0.020, 0.035, 0.040, 0.050};
  for (int i = 0; i < 5; ++i) {
    RequestOutcome outcome = completed(i * 0.1, ttfts[i], ttfts[i] + 0.4, 5);
    outcome.itl_s = {0.1, 0.1, 0.1, 0.1};
    outcome.generated_text = "text " + std::to_string(i);
    result.outcomes.push_back(outcome);
  }
  RequestOutcome failed;
  failed.error = "HTTP 500: boom";
  failed.prompt_tokens = 10;
  failed.output_tokens = 3;  // counted by the server, but the request failed
  result.outcomes.push_back(failed);
  RunOptions options;
  options.percentile_metrics = {"ttft", "e2el"};
  options.metric_percentiles = {50, 99.9};
  options.slo.ttft_ms = 30;
  summarize_outcomes(result, options.slo);
  WorkloadOptions workload;
  workload.num_prompts = 6;
  workload.request_rate = 4;
  workload.burstiness = 0.5;
  const nlohmann::json json = nlohmann::json::parse(result_json(result, workload, options).dump());

  EXPECT_NEAR(json["mean_ttft_ms"].get<double>(), 32.0, 1e-9);
  EXPECT_NEAR(json["median_ttft_ms"].get<double>(), 35.0, 1e-9);
  EXPECT_NEAR(json["std_ttft_ms"].get<double>(), 12.884098726725126, 1e-9);
  EXPECT_NEAR(json["p50_ttft_ms"].get<double>(), 35.0, 1e-9);
  EXPECT_NEAR(json["p99.9_ttft_ms"].get<double>(), 49.96, 1e-9);
  EXPECT_NEAR(json["mean_e2el_ms"].get<double>(), 432.0, 1e-9);
  EXPECT_NEAR(json["std_e2el_ms"].get<double>(), 12.884098726725126, 1e-9);
  for (const char* absent : {"mean_tpot_ms", "p99_ttft_ms", "mean_itl_ms", "p99_e2el_ms"}) {
    EXPECT_FALSE(json.contains(absent)) << absent;
  }
  EXPECT_DOUBLE_EQ(json["duration"].get<double>(), json["duration_s"].get<double>());
  EXPECT_NEAR(json["duration"].get<double>(), 0.85, 1e-12);  // when the last one ends
  EXPECT_EQ(json["completed"], 5);
  EXPECT_EQ(json["failed"], 1);
  EXPECT_EQ(json["total_input_tokens"], 50);
  EXPECT_EQ(json["total_output_tokens"], 25);
  EXPECT_NEAR(json["total_token_throughput"].get<double>(), 75 / 0.85, 1e-9);
  EXPECT_NEAR(json["request_goodput"].get<double>(), 2 / 0.85, 1e-9);  // TTFT 15 and 20 ms
  EXPECT_EQ(json["input_lens"], nlohmann::json({10, 10, 10, 10, 10, 10}));
  EXPECT_EQ(json["output_lens"], nlohmann::json({5, 5, 5, 5, 5, 0}));
  EXPECT_EQ(json["ttfts"][2], 0.035);
  EXPECT_EQ(json["itls"][0], nlohmann::json({0.1, 0.1, 0.1, 0.1}));
  EXPECT_NEAR(json["latencies"][1].get<double>(), 0.42, 1e-12);
  EXPECT_EQ(json["generated_texts"][4], "text 4");
  EXPECT_EQ(json["errors"][0], "");
  EXPECT_EQ(json["errors"][5], "HTTP 500: boom");
  EXPECT_EQ(json["model_id"], "m");
  EXPECT_EQ(json["backend"], "openai");
  EXPECT_EQ(json["num_prompts"], 6);
  EXPECT_EQ(json["request_rate"], 4.0);
  EXPECT_EQ(json["burstiness"], 0.5);
  EXPECT_TRUE(json["max_concurrency"].is_null());
  EXPECT_TRUE(json["tokenizer_id"].is_null());
  EXPECT_TRUE(std::regex_match(json["date"].get<std::string>(), std::regex("[0-9]{8}-[0-9]{6}")))
      << json["date"];

  options.slo = {};
  workload.request_rate = std::numeric_limits<double>::infinity();
  const nlohmann::json unlimited =
      nlohmann::json::parse(result_json(result, workload, options).dump());
  EXPECT_EQ(unlimited["request_rate"], "inf");
  EXPECT_TRUE(unlimited["request_goodput"].is_null());
  EXPECT_TRUE(unlimited["config"]["request_rate"].is_null());  // the existing key is unchanged
}

TEST(BaseUrl, ParsesHostAndPort) {
  const Result<Endpoint> endpoint = parse_base_url("http://127.0.0.1:8123/");
  ASSERT_TRUE(endpoint.ok());
  EXPECT_EQ(endpoint->host, "127.0.0.1");
  EXPECT_EQ(endpoint->port, "8123");
  EXPECT_EQ(parse_base_url("http://localhost")->port, "80");
  EXPECT_FALSE(parse_base_url("https://x:1").ok());
  EXPECT_FALSE(parse_base_url("http://x:99999").ok());
  EXPECT_FALSE(parse_base_url("http://x:8000/v1").ok());
  EXPECT_FALSE(parse_base_url("http://:8000").ok());
}

// Runs the benchmark binary with `args`; returns its exit code, stderr in `errors`.
int run_binary(const std::string& args, std::string& errors) {
  const fs::path err_file =
      fs::temp_directory_path() / ("bench_serving_stderr_" + std::to_string(getpid()) + ".txt");
  const std::string command =
      std::string(PDSERVE_BENCH_SERVING_BIN) + " " + args + " >/dev/null 2>" + err_file.string();
  const int status = std::system(command.c_str());
  FILE* file = std::fopen(err_file.c_str(), "r");
  errors.clear();
  if (file != nullptr) {
    char buffer[512];
    while (std::fgets(buffer, sizeof(buffer), file) != nullptr) errors += buffer;
    std::fclose(file);
  }
  fs::remove(err_file);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Cli, BadFlagsExitTwoWithAMessage) {
  struct Case {
    const char* args;
    const char* message;
  };
  const Case cases[] = {
      {"--num-prompts 0", "--num-prompts"},
      {"--input-len -3", "--input-len"},
      {"--output-len abc", "--output-len"},
      {"--range-ratio 1", "--range-ratio"},
      {"--request-rate 0", "--request-rate"},
      {"--request-rate -2", "--request-rate"},
      {"--request-rate fast", "--request-rate"},
      {"--max-concurrency -1", "--max-concurrency"},
      {"--shared-prefix-len -1", "--shared-prefix-len"},
      {"--request-timeout 0", "--request-timeout"},
      {"--slo-ttft-ms -5", "--slo-ttft-ms"},
      {"--slo-tpot-ms 0", "--slo-tpot-ms"},
      {"--base-url localhost:8000", "--base-url"},
      {"--base-url http://h:0", "port"},
      {"--no-such-flag", "no-such-flag"},
      {"--dataset sharegpt", "--dataset"},
      {"--max-input-len 0", "--max-input-len"},
      {"--max-output-len -1", "--max-output-len"},
      {"--dataset-path /nonexistent/prompts.jsonl", "/nonexistent/prompts.jsonl"},
      {"--dataset random --dataset-path x.jsonl", "excludes"},
  };
  for (const Case& c : cases) {
    std::string errors;
    EXPECT_EQ(run_binary(c.args, errors), 2) << c.args;
    EXPECT_NE(errors.find(c.message), std::string::npos) << c.args << " -> " << errors;
  }
  std::string errors;
  EXPECT_EQ(run_binary("--help", errors), 0);

  // A prompt file that is not JSONL is refused before any connection, naming the line.
  const fs::path bad =
      fs::temp_directory_path() / ("bench_bad_prompts_" + std::to_string(getpid()) + ".jsonl");
  {
    std::ofstream file(bad);
    file << "{\"prompt\": [1, 2]}\n{\"prompt\": \"ok\"}\n{\"prompt\": [3,\n";
  }
  EXPECT_EQ(run_binary("--base-url http://127.0.0.1:1 --dataset-path " + bad.string(), errors), 2);
  EXPECT_NE(errors.find(bad.string() + ":3: not a JSON value"), std::string::npos) << errors;
  fs::remove(bad);
}

// A server on a free port that answers each connection with `respond` on its own thread,
// given the request's body (read to its Content-Length).
class FakeServer {
 public:
  explicit FakeServer(std::function<void(tcp::socket&)> respond)
      : FakeServer([respond = std::move(respond)](tcp::socket& socket, const std::string&) {
          respond(socket);
        }) {}
  explicit FakeServer(std::function<void(tcp::socket&, const std::string&)> respond)
      : acceptor_(io_, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0)),
        thread_([this, respond = std::move(respond)] {
          boost::system::error_code ec;
          for (;;) {
            tcp::socket socket(io_);
            acceptor_.accept(socket, ec);
            if (ec || stopping_) return;
            boost::asio::streambuf request;
            const size_t header_end = boost::asio::read_until(socket, request, "\r\n\r\n", ec);
            respond(socket, read_body(socket, request, header_end));
            sockets_.push_back(std::move(socket));  // stalled answers keep theirs open
          }
        }) {}
  ~FakeServer() {
    stopping_ = true;
    boost::system::error_code ec;
    tcp::socket poke(io_);
    poke.connect(acceptor_.local_endpoint(), ec);
    thread_.join();
  }
  Endpoint endpoint() const {
    return {"127.0.0.1", std::to_string(acceptor_.local_endpoint().port())};
  }

 private:
  // The body after the headers (the first `header_end` bytes of `buffer`), by Content-Length.
  static std::string read_body(tcp::socket& socket, boost::asio::streambuf& buffer,
                               size_t header_end) {
    const std::string received(boost::asio::buffers_begin(buffer.data()),
                               boost::asio::buffers_end(buffer.data()));
    std::smatch length;
    const std::string headers = received.substr(0, header_end);
    if (!std::regex_search(headers, length,
                           std::regex("Content-Length: *([0-9]+)", std::regex::icase))) {
      return {};
    }
    const size_t size = std::stoul(length[1]);
    std::string body = received.substr(header_end);
    boost::system::error_code ec;
    if (body.size() < size) {
      std::string rest(size - body.size(), '\0');
      boost::asio::read(socket, boost::asio::buffer(rest), ec);
      body += rest;
    }
    return body;
  }

  boost::asio::io_context io_;
  tcp::acceptor acceptor_;
  std::vector<tcp::socket> sockets_;
  std::atomic<bool> stopping_ = false;
  std::thread thread_;
};

// vLLM's flags with bad values: exit 2 with a message naming the flag, and not one connection to
// the server (all of it is checked before any request).
TEST(Cli, BadVllmStyleInputExitsTwoBeforeAnyRequest) {
  std::atomic<int> connections = 0;
  FakeServer server([&](tcp::socket&) { ++connections; });
  const std::string base_url =
      "--base-url http://127.0.0.1:" + server.endpoint().port + " --model m ";
  const fs::path bad_sharegpt =
      fs::temp_directory_path() / ("bench_bad_sharegpt_" + std::to_string(getpid()) + ".json");
  {
    std::ofstream file(bad_sharegpt);
    file << "[{\"conversations\": [{\"value\": \"a question\"}, {\"value\": \"an answer\"}]},\n"
            " {\"conversations\": [{\"value\": \"a question\"}, {\"value\": 42}]}]\n";
  }
  const std::string sharegpt =
      "--dataset-name sharegpt --dataset-path " + kShareGptFixture.string();
  const std::string tokenizer = " --tokenizer " + kQwen3Tokenizer.string();
  struct Case {
    std::string args;
    std::string message;
  };
  const Case cases[] = {
      {"--request-rate 4 --burstiness 0", "--burstiness must be a positive number"},
      {"--request-rate 4 --burstiness -1", "--burstiness must be a positive number"},
      {"--burstiness abc", "--burstiness"},
      {"--goodput ttft", "--goodput takes KEY:MS items"},
      {"--goodput ttft:abc", "--goodput takes KEY:MS items"},
      {"--goodput 'ttft:5 latency:5'", "unknown metric"},
      {"--goodput ttft:-5", "--goodput takes KEY:MS items"},
      {"--goodput ttft:5 --slo-ttft-ms 5", "excludes"},
      {"--percentile-metrics ttft,foo", "unknown metric 'foo'"},
      {"--percentile-metrics client_queue_time", "unknown metric 'client_queue_time'"},
      {"--metric-percentiles 101", "--metric-percentiles: '101'"},
      {"--metric-percentiles 50,x", "--metric-percentiles: 'x'"},
      {"--endpoint /v1/embeddings", "--endpoint must be"},
      {"--backend openai-chat", "--backend openai-chat does not post to --endpoint"},
      {"--endpoint /v1/chat/completions --backend vllm", "--backend vllm does not post"},
      {"--endpoint /v1/chat/completions", "needs text prompts"},
      {"--dataset-name sharegpt", "--dataset-name sharegpt needs --dataset-path"},
      {sharegpt, "needs --tokenizer"},
      {sharegpt + " --tokenizer /nonexistent/tokenizer", "--tokenizer"},
      {"--dataset-name sharegpt --dataset-path " + bad_sharegpt.string() + tokenizer,
       bad_sharegpt.string() + ": entry 1: conversations[1] has no string \"value\""},
      {"--dataset-name sharegpt --dataset-path /nonexistent/sharegpt.json" + tokenizer,
       "/nonexistent/sharegpt.json"},
      {"--dataset-name random --dataset-path " + kShareGptFixture.string(), "excludes"},
      {"--dataset-name multiturn", "it needs --endpoint /v1/chat/completions"},
      {"--num-turns 3", "--num-turns is for --dataset-name multiturn"},
      {"--dataset-name multiturn --endpoint /v1/chat/completions --num-turns 0", "--num-turns"},
      {"--dataset-name multiturn --endpoint /v1/chat/completions --num-turns x", "--num-turns"},
  };
  for (const Case& c : cases) {
    std::string errors;
    EXPECT_EQ(run_binary(base_url + c.args, errors), 2) << c.args;
    EXPECT_NE(errors.find("error: "), std::string::npos) << c.args << " -> " << errors;
    EXPECT_NE(errors.find(c.message), std::string::npos) << c.args << " -> " << errors;
  }
  fs::remove(bad_sharegpt);
  EXPECT_EQ(connections.load(), 0);
}

std::vector<BenchRequest> small_workload(int num_prompts) {
  WorkloadOptions options;
  options.num_prompts = num_prompts;
  options.input_len = 8;
  options.output_len = 4;
  options.vocab_size = 1000;
  return make_workload(options).value();
}

TEST(Failures, ServerDyingMidStreamIsReportedPerRequest) {
  FakeServer server([](tcp::socket& socket) {
    const std::string event = "data: {\"choices\":[{\"index\":0,\"text\":\"hi\"}]}\n\n";
    char size[16];
    std::snprintf(size, sizeof(size), "%zx", event.size());
    const std::string partial =
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
        std::string(size) + "\r\n" + event + "\r\n";
    boost::system::error_code ec;
    boost::asio::write(socket, boost::asio::buffer(partial), ec);
    socket.close(ec);  // dies before [DONE]
  });
  RunOptions options;
  options.endpoint = server.endpoint();
  options.model = "m";
  options.max_concurrency = 2;
  options.request_timeout = std::chrono::seconds(20);
  const Result<BenchmarkResult> result = run_benchmark(options, small_workload(3));
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(result->completed, 0);
  EXPECT_EQ(result->failed, 3);
  for (const RequestOutcome& outcome : result->outcomes) {
    EXPECT_FALSE(outcome.success);
    EXPECT_NE(outcome.error.find("after 1 chunks"), std::string::npos) << outcome.error;
  }
  EXPECT_NE(format_report(*result).find("3 x stream after 1 chunks"), std::string::npos)
      << format_report(*result);
}

TEST(Failures, ErrorStatusIsReportedWithItsBody) {
  FakeServer server([](tcp::socket& socket) {
    const std::string body = "{\"error\":{\"message\":\"queue full\"}}";
    char size[16];
    std::snprintf(size, sizeof(size), "%zx", body.size());
    const std::string response =
        "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nTransfer-Encoding: chunked\r\n\r\n" +
        std::string(size) + "\r\n" + body + "\r\n0\r\n\r\n";
    boost::system::error_code ec;
    boost::asio::write(socket, boost::asio::buffer(response), ec);
  });
  RunOptions options;
  options.endpoint = server.endpoint();
  options.model = "m";
  options.request_timeout = std::chrono::seconds(20);
  const Result<BenchmarkResult> result = run_benchmark(options, small_workload(1));
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->failed, 1);
  EXPECT_NE(result->outcomes[0].error.find("HTTP 429"), std::string::npos);
  EXPECT_NE(result->outcomes[0].error.find("queue full"), std::string::npos)
      << result->outcomes[0].error;
}

TEST(Failures, StalledServerHitsTheDeadline) {
  FakeServer server([](tcp::socket&) {});  // reads the request, never answers
  RunOptions options;
  options.endpoint = server.endpoint();
  options.model = "m";
  options.request_timeout = std::chrono::milliseconds(500);
  const auto start = std::chrono::steady_clock::now();
  const Result<BenchmarkResult> result = run_benchmark(options, small_workload(2));
  ASSERT_TRUE(result.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(result->failed, 2);
  EXPECT_NE(result->outcomes[0].error.find("deadline exceeded"), std::string::npos)
      << result->outcomes[0].error;
}

// One complete stream of `output_tokens` one-token chunks, then `usage` and [DONE], in a
// chunked HTTP/1.1 response.
std::string complete_stream(int output_tokens, const nlohmann::json& usage) {
  std::string events;
  for (int i = 0; i < output_tokens; ++i) {
    events += "data: {\"choices\":[{\"index\":0,\"text\":\"t\"}]}\n\n";
  }
  events +=
      "data: " + nlohmann::json{{"choices", nlohmann::json::array()}, {"usage", usage}}.dump() +
      "\n\ndata: [DONE]\n\n";
  char size[16];
  std::snprintf(size, sizeof(size), "%zx", events.size());
  return "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: "
         "chunked\r\n\r\n" +
         std::string(size) + "\r\n" + events + "\r\n0\r\n\r\n";
}

// usage.pdserve_timeline of the last chunk lands, as sent, in the request's JSON record; a
// request whose server sent none has no "timeline".
TEST(Timeline, UsageTimelineIsCopiedIntoTheRequestRecord) {
  const nlohmann::json timeline = {
      {"spans",
       {{{"name", "route"}, {"start_ms", 0.0}, {"end_ms", 0.25}},
        {{"name", "prefill"}, {"start_ms", 0.5}, {"end_ms", 3.5}},
        {{"name", "kv_transfer"}, {"start_ms", 3.5}, {"end_ms", 4.0}, {"bytes", 65536}},
        {{"name", "decode"}, {"start_ms", 4.0}, {"end_ms", 9.0}}}}};
  std::atomic<int> connections = 0;
  FakeServer server([&](tcp::socket& socket) {
    nlohmann::json usage = {{"prompt_tokens", 8}, {"completion_tokens", 4}, {"total_tokens", 12}};
    if (connections++ == 0) usage["pdserve_timeline"] = timeline;
    const std::string response = complete_stream(4, usage);
    boost::system::error_code ec;
    boost::asio::write(socket, boost::asio::buffer(response), ec);
  });
  RunOptions options;
  options.label = "fake-1P1D";
  options.endpoint = server.endpoint();
  options.model = "m";
  options.max_concurrency = 1;  // in order: the first request gets the timeline
  options.request_timeout = std::chrono::seconds(20);
  WorkloadOptions workload;
  workload.num_prompts = 2;
  workload.input_len = 8;
  workload.output_len = 4;
  workload.vocab_size = 1000;
  const Result<BenchmarkResult> result = run_benchmark(options, make_workload(workload).value());
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  ASSERT_EQ(result->completed, 2) << format_report(*result);
  EXPECT_EQ(nlohmann::json::parse(result->outcomes[0].timeline.dump()), timeline);
  EXPECT_TRUE(result->outcomes[1].timeline.is_null());

  const nlohmann::json json = nlohmann::json::parse(result_json(*result, workload, options).dump());
  EXPECT_EQ(json["label"], "fake-1P1D");
  ASSERT_EQ(json["requests"].size(), 2u);
  EXPECT_EQ(json["requests"][0]["timeline"], timeline);
  EXPECT_FALSE(json["requests"][1].contains("timeline"));
  EXPECT_EQ(json["requests"][1]["itl_ms"].size(), 3u);
  EXPECT_EQ(json["config"]["max_concurrency"], 1);

  options.label.clear();
  EXPECT_TRUE(result_json(*result, workload, options)["label"].is_null());
}

std::vector<std::string> words_of(const std::string& text) {
  std::istringstream stream(text);
  std::vector<std::string> words;
  for (std::string word; stream >> word;) words.push_back(word);
  return words;
}

WorkloadOptions multiturn_options() {
  WorkloadOptions options;
  options.num_prompts = 5;
  options.num_turns = 4;
  options.input_len = 6;
  options.output_len = 3;
  options.shared_prefix_len = 7;
  options.request_rate = 50;
  options.seed = 11;
  return options;
}

// Conversation by conversation, turns 0..N-1 in order, each a message of input_len known words
// after the same system prompt, the turns of one conversation at its arrival time; seeded.
TEST(Workload, MultiTurnConversationsInOrderWithASharedSystemPrompt) {
  const WorkloadOptions options = multiturn_options();
  const Result<std::vector<BenchRequest>> requests = make_workload(options);
  ASSERT_TRUE(requests.ok()) << requests.status().to_string();
  ASSERT_EQ(requests->size(), 20u);
  EXPECT_EQ(dataset_name(options), "multiturn");
  const std::set<std::string> known(std::begin(kMultiTurnWords), std::end(kMultiTurnWords));
  std::set<std::string> messages;
  for (size_t index = 0; index < requests->size(); ++index) {
    const BenchRequest& request = (*requests)[index];
    EXPECT_EQ(request.turn, static_cast<int>(index % 4));
    EXPECT_TRUE(request.prompt.empty());
    EXPECT_EQ(request.output_len, 3);
    EXPECT_EQ(request.system_prompt, (*requests)[0].system_prompt);
    const std::vector<std::string> words = words_of(request.prompt_text);
    EXPECT_EQ(words.size(), 6u) << request.prompt_text;
    for (const std::string& word : words) EXPECT_TRUE(known.count(word)) << word;
    messages.insert(request.prompt_text);
    if (request.turn > 0) {
      EXPECT_EQ(request.arrival_s, (*requests)[index - 1].arrival_s);
    } else if (index > 0) {
      EXPECT_GT(request.arrival_s, (*requests)[index - 1].arrival_s);  // rate 50: a gap each
    }
  }
  EXPECT_EQ(messages.size(), 20u);  // 6 words of 64: no two messages alike
  EXPECT_EQ(words_of((*requests)[0].system_prompt).size(), 7u);

  const Result<std::vector<BenchRequest>> again = make_workload(options);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[13].prompt_text, (*requests)[13].prompt_text);
  WorkloadOptions other = options;
  other.seed = 12;
  EXPECT_NE(make_workload(other).value()[13].prompt_text, (*requests)[13].prompt_text);
  other = options;
  other.shared_prefix_len = 0;
  EXPECT_TRUE(make_workload(other).value()[0].system_prompt.empty());
}

// A chat stream answering `text` in one chunk, with `completion_tokens` as usage.
std::string chat_stream(const std::string& text, int completion_tokens) {
  const nlohmann::json chunk = {{"choices", {{{"index", 0}, {"delta", {{"content", text}}}}}}};
  const nlohmann::json usage = {{"choices", nlohmann::json::array()},
                                {"usage",
                                 {{"prompt_tokens", 10},
                                  {"completion_tokens", completion_tokens},
                                  {"total_tokens", 10 + completion_tokens}}}};
  const std::string events =
      "data: " + chunk.dump() + "\n\ndata: " + usage.dump() + "\n\ndata: [DONE]\n\n";
  char size[16];
  std::snprintf(size, sizeof(size), "%zx", events.size());
  return "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: "
         "chunked\r\n\r\n" +
         std::string(size) + "\r\n" + events + "\r\n0\r\n\r\n";
}

// Answers every chat request with "re: " + its last message's content; records the bodies.
struct EchoChatServer {
  std::mutex mutex;
  std::vector<nlohmann::json> bodies;
  // Turns of this number get HTTP 500 instead (-1: none).
  int failing_turn = -1;
  FakeServer server{[this](tcp::socket& socket, const std::string& text) {
    const nlohmann::json body = nlohmann::json::parse(text);
    const int turn = static_cast<int>(body["messages"].size() - 2) / 2;  // system + 2 per turn
    {
      std::lock_guard<std::mutex> lock(mutex);
      bodies.push_back(body);
    }
    const std::string response =
        turn == failing_turn
            ? std::string("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\n\r\nno")
            : chat_stream("re: " + body["messages"].back()["content"].get<std::string>(),
                          body["max_completion_tokens"].get<int>());
    boost::system::error_code ec;
    boost::asio::write(socket, boost::asio::buffer(response), ec);
  }};
};

RunOptions chat_run_options(const Endpoint& endpoint) {
  RunOptions options;
  options.endpoint = endpoint;
  options.model = "m";
  options.route = ApiRoute::kChatCompletions;
  options.max_concurrency = 2;
  options.request_timeout = std::chrono::seconds(20);
  return options;
}

// Each turn sends the system prompt, every earlier user message followed by the answer the
// server streamed to it, then its own message; and is sent only after the previous answer.
TEST(MultiTurn, EachTurnSendsTheConversationSoFarAfterThePreviousAnswer) {
  EchoChatServer chat;
  const WorkloadOptions workload = multiturn_options();
  const std::vector<BenchRequest> requests = make_workload(workload).value();
  const Result<BenchmarkResult> result =
      run_benchmark(chat_run_options(chat.server.endpoint()), requests);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  ASSERT_EQ(result->completed, 20) << format_report(*result);
  ASSERT_EQ(chat.bodies.size(), 20u);
  std::map<std::string, nlohmann::json> by_last_message;
  for (const nlohmann::json& body : chat.bodies) {
    by_last_message[body["messages"].back()["content"].get<std::string>()] = body["messages"];
  }
  for (size_t index = 0; index < requests.size(); ++index) {
    const BenchRequest& request = requests[index];
    ASSERT_TRUE(by_last_message.count(request.prompt_text)) << index;
    const nlohmann::json& messages = by_last_message[request.prompt_text];
    ASSERT_EQ(messages.size(), static_cast<size_t>(2 + 2 * request.turn)) << messages.dump();
    EXPECT_EQ(messages[0],
              (nlohmann::json{{"role", "system"}, {"content", request.system_prompt}}));
    for (int turn = 0; turn <= request.turn; ++turn) {
      const std::string& user = requests[index - request.turn + turn].prompt_text;
      EXPECT_EQ(messages[1 + 2 * turn], (nlohmann::json{{"role", "user"}, {"content", user}}));
      if (turn < request.turn) {
        EXPECT_EQ(messages[2 + 2 * turn],
                  (nlohmann::json{{"role", "assistant"}, {"content", "re: " + user}}));
      }
    }
    const RequestOutcome& outcome = result->outcomes[index];
    EXPECT_EQ(outcome.generated_text, "re: " + request.prompt_text);
    if (request.turn > 0) {
      const RequestOutcome& previous = result->outcomes[index - 1];
      EXPECT_GE(outcome.start_s, previous.start_s + previous.e2e_s);
    }
  }
  const nlohmann::json json =
      nlohmann::json::parse(result_json(*result, workload, chat_run_options({})).dump());
  EXPECT_EQ(json["config"]["dataset"], "multiturn");
  EXPECT_EQ(json["config"]["num_turns"], 4);
  EXPECT_EQ(json["requests"].size(), 20u);
}

// A failed turn ends its conversation: the turns after it are not sent and count as failed.
TEST(MultiTurn, TheTurnsAfterAFailedOneAreNotSent) {
  EchoChatServer chat;
  chat.failing_turn = 1;
  const std::vector<BenchRequest> requests = make_workload(multiturn_options()).value();
  const Result<BenchmarkResult> result =
      run_benchmark(chat_run_options(chat.server.endpoint()), requests);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(result->completed, 5);
  EXPECT_EQ(result->failed, 15);
  EXPECT_EQ(chat.bodies.size(), 10u);  // turns 0 and 1 of each conversation
  for (size_t index = 0; index < requests.size(); ++index) {
    const RequestOutcome& outcome = result->outcomes[index];
    switch (requests[index].turn) {
      case 0:
        EXPECT_TRUE(outcome.success) << outcome.error;
        break;
      case 1:
        EXPECT_NE(outcome.error.find("HTTP 500"), std::string::npos) << outcome.error;
        break;
      default:
        EXPECT_EQ(outcome.error, "not sent: turn " + std::to_string(requests[index].turn - 1) +
                                     " of its conversation failed");
    }
  }
}

// pdserve-decode on the tiny model, started on a free port; stopped with SIGTERM.
class LiveServer {
 public:
  LiveServer(const fs::path& model) {
    int out[2];
    if (pipe(out) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      close(out[1]);
      execl(PDSERVE_DECODE_BIN, PDSERVE_DECODE_BIN, "--model", model.c_str(), "--port", "0",
            "--threads", "1", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(out[1]);
    stdout_fd_ = out[0];
    banner_ = read_banner(std::chrono::seconds(60));
  }
  ~LiveServer() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
    if (stdout_fd_ >= 0) close(stdout_fd_);
  }
  // "pdserve-decode: serving NAME on http://HOST:PORT (device cpu)", or empty.
  const std::string& banner() const { return banner_; }

 private:
  std::string read_banner(std::chrono::seconds timeout) {
    std::string text;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (text.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd fd{stdout_fd_, POLLIN, 0};
      if (poll(&fd, 1, 200) <= 0) continue;
      char buffer[256];
      const ssize_t n = read(stdout_fd_, buffer, sizeof(buffer));
      if (n <= 0) break;
      text.append(buffer, static_cast<size_t>(n));
    }
    return text.substr(0, text.find('\n'));
  }

  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string banner_;
};

// The tiny model (tests/data/reference/configs/tiny.json) in a temporary directory.
fs::path make_tiny_model() {
  const fs::path model =
      fs::temp_directory_path() / ("bench_serving_tiny_" + std::to_string(getpid()));
  const std::string make = std::string(PDSERVE_MAKE_MODEL_BIN) + " --config " +
                           PDSERVE_TEST_DATA_DIR + "/reference/configs/tiny.json --out " +
                           model.string() + " --seed 7 >/dev/null";
  EXPECT_EQ(std::system(make.c_str()), 0) << make;
  return model;
}

// The http://HOST:PORT of a LiveServer's banner.
Result<std::string> base_url_of(const LiveServer& server) {
  const std::string& banner = server.banner();
  const size_t url = banner.find("http://");
  if (url == std::string::npos) {
    return unavailable("no banner from pdserve-decode: '" + banner + "'");
  }
  return banner.substr(url, banner.find(' ', url) - url);
}

TEST(Live, EightStreamingPromptsOnTheTinyModelHaveExactTokenCounts) {
  const fs::path model = make_tiny_model();
  {
    LiveServer server(model);
    const Result<std::string> base_url = base_url_of(server);
    ASSERT_TRUE(base_url.ok()) << base_url.status().to_string();
    const Result<Endpoint> endpoint = parse_base_url(*base_url);
    ASSERT_TRUE(endpoint.ok()) << endpoint.status().to_string();

    WorkloadOptions workload;
    workload.num_prompts = 8;
    workload.input_len = 24;
    workload.output_len = 6;
    workload.range_ratio = 0.5;
    workload.shared_prefix_len = 16;
    workload.seed = 11;
    const std::vector<BenchRequest> requests = make_workload(workload).value();
    RunOptions options;
    options.endpoint = *endpoint;
    options.max_concurrency = 4;
    options.request_timeout = std::chrono::seconds(120);
    const Result<BenchmarkResult> result = run_benchmark(options, requests);
    ASSERT_TRUE(result.ok()) << result.status().to_string();
    EXPECT_EQ(result->model, "bench_serving_tiny_" + std::to_string(getpid()));
    EXPECT_EQ(result->completed, 8) << format_report(*result);
    long input_tokens = 0, output_tokens = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      const RequestOutcome& outcome = result->outcomes[i];
      EXPECT_TRUE(outcome.success) << outcome.error;
      EXPECT_EQ(outcome.prompt_tokens, static_cast<int>(requests[i].prompt.size()));
      EXPECT_EQ(outcome.output_tokens, requests[i].output_len);
      EXPECT_GE(outcome.text_chunks, 1);
      EXPECT_EQ(outcome.itl_s.size(), static_cast<size_t>(outcome.text_chunks - 1));
      EXPECT_GT(outcome.ttft_s, 0);
      EXPECT_LE(outcome.ttft_s, outcome.e2e_s);
      input_tokens += static_cast<long>(requests[i].prompt.size());
      output_tokens += requests[i].output_len;
    }
    EXPECT_EQ(result->total_input_tokens, input_tokens);
    EXPECT_EQ(result->total_output_tokens, output_tokens);
    EXPECT_NEAR(result->output_throughput * result->duration_s, static_cast<double>(output_tokens),
                1e-6);

    // A text prompt is tokenized by the server; its count comes from the usage chunk. Qwen3's
    // tokenizer (vendored with the model) makes "Hello, world" [9707, 11, 1879].
    BenchRequest text_request;
    text_request.prompt_text = "Hello, world";
    text_request.output_len = 3;
    const Result<BenchmarkResult> text_result = run_benchmark(options, {text_request});
    ASSERT_TRUE(text_result.ok()) << text_result.status().to_string();
    ASSERT_EQ(text_result->completed, 1) << format_report(*text_result);
    EXPECT_EQ(text_result->outcomes[0].prompt_tokens, 3);
    EXPECT_EQ(text_result->outcomes[0].output_tokens, 3);
    EXPECT_EQ(text_result->total_input_tokens, 3);
  }
  fs::remove_all(model);
}

double mean_of(const std::vector<double>& values) {
  double sum = 0;
  for (double value : values) sum += value;
  return values.empty() ? 0 : sum / static_cast<double>(values.size());
}

// The JSON that plots are made from: the binary's --result-json on a live Poisson run carries
// the label and load settings, and its per-request records reproduce every summary figure.
TEST(Live, ResultJsonRecordsReproduceTheSummary) {
  const fs::path model = make_tiny_model();
  const fs::path json_path =
      fs::temp_directory_path() / ("bench_serving_result_" + std::to_string(getpid()) + ".json");
  {
    LiveServer server(model);
    const Result<std::string> base_url = base_url_of(server);
    ASSERT_TRUE(base_url.ok()) << base_url.status().to_string();
    std::string errors;
    const int code = run_binary("--base-url " + *base_url +
                                    " --num-prompts 12 --input-len 16 --output-len 5"
                                    " --range-ratio 0.5 --vocab-size 1000 --request-rate 40"
                                    " --max-concurrency 4 --slo-ttft-ms 30 --slo-tpot-ms 5"
                                    " --label tiny-colocated --result-json " +
                                    json_path.string(),
                                errors);
    ASSERT_EQ(code, 0) << errors;
  }
  fs::remove_all(model);
  const Result<nlohmann::json> read = read_json_file(json_path);
  fs::remove(json_path);
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  const nlohmann::json& json = *read;
  EXPECT_EQ(json["label"], "tiny-colocated");
  EXPECT_EQ(json["config"]["request_rate"], 40.0);
  EXPECT_EQ(json["config"]["max_concurrency"], 4);
  EXPECT_EQ(json["slo"]["ttft_ms"], 30.0);
  ASSERT_EQ(json["requests"].size(), 12u);
  EXPECT_EQ(json["completed"], 12);

  std::vector<double> ttft, tpot, itl, e2e;
  long output_tokens = 0;
  int good = 0;
  double last_end_ms = 0;
  for (const nlohmann::json& record : json["requests"]) {
    ASSERT_TRUE(record["success"].get<bool>()) << record["error"];
    EXPECT_EQ(record["error"], "");
    const int tokens = record["output_tokens"];
    const double record_ttft = record["ttft_ms"], record_e2e = record["e2e_ms"];
    const std::vector<double> gaps = record["itl_ms"];
    EXPECT_EQ(gaps.size(), record["text_chunks"].get<size_t>() - 1);
    // The first chunk and every gap after it happen within the request.
    double streamed = record_ttft;
    for (double gap : gaps) streamed += gap;
    EXPECT_LE(streamed, record_e2e + 1e-6);
    EXPECT_GE(record["start_ms"].get<double>(), 0.0);
    last_end_ms = std::max(last_end_ms, record["start_ms"].get<double>() + record_e2e);
    ttft.push_back(record_ttft);
    e2e.push_back(record_e2e);
    itl.insert(itl.end(), gaps.begin(), gaps.end());
    output_tokens += tokens;
    const double record_tpot = tokens > 1 ? (record_e2e - record_ttft) / (tokens - 1) : 0;
    if (tokens > 1) tpot.push_back(record_tpot);
    good += record_ttft <= 30 && record_tpot <= 5;
  }
  EXPECT_EQ(json["total_output_tokens"].get<long>(), output_tokens);
  EXPECT_NEAR(json["duration_s"].get<double>() * 1e3, last_end_ms, 1e-6);
  EXPECT_EQ(json["good_requests"].get<int>(), good);
  EXPECT_NEAR(json["goodput"].get<double>(), good / json["duration_s"].get<double>(), 1e-9);
  const auto expect_summary = [](const nlohmann::json& summary, const std::vector<double>& values,
                                 const char* name) {
    EXPECT_EQ(summary["count"].get<size_t>(), values.size()) << name;
    EXPECT_NEAR(summary["mean"].get<double>(), mean_of(values), 1e-9) << name;
    EXPECT_NEAR(summary["p90"].get<double>(), percentile(values, 90), 1e-9) << name;
    EXPECT_NEAR(summary["max"].get<double>(), *std::max_element(values.begin(), values.end()), 1e-9)
        << name;
  };
  expect_summary(json["ttft_ms"], ttft, "ttft");
  expect_summary(json["tpot_ms"], tpot, "tpot");
  expect_summary(json["itl_ms"], itl, "itl");
  expect_summary(json["e2e_ms"], e2e, "e2e");
}

// vLLM's ShareGPT command line against the live node, on /v1/completions and on
// /v1/chat/completions: every conversation the filter keeps completes with its reply's token
// count (ignore_eos), input counts come from the server (the completion prompt's equal the
// Hugging Face counts; the chat template adds the same tokens to each), and vLLM's keys agree
// with the file's own summary and per-request records.
TEST(Live, ShareGptOnBothEndpointsWritesVllmKeysConsistentWithTheSummary) {
  const fs::path model = make_tiny_model();
  const std::string stem =
      (fs::temp_directory_path() / ("bench_serving_vllm_" + std::to_string(getpid()))).string();
  {
    LiveServer server(model);
    const Result<std::string> base_url = base_url_of(server);
    ASSERT_TRUE(base_url.ok()) << base_url.status().to_string();
    const std::string common =
        "--base-url " + *base_url + " --dataset-name sharegpt --dataset-path " +
        kShareGptFixture.string() + " --tokenizer " + model.string() +
        " --disable-shuffle --num-prompts 4 --max-concurrency 2 --request-rate 50"
        " --burstiness 0.5 --goodput ttft:60000 e2el:120000 --ignore-eos"
        " --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99.9";
    std::string errors;
    ASSERT_EQ(run_binary(common + " --result-json " + stem + "_completions.json", errors), 0)
        << errors;
    ASSERT_EQ(run_binary(common +
                             " --endpoint /v1/chat/completions --backend openai-chat"
                             " --result-filename " +
                             stem + "_chat.json",
                         errors),
              0)
        << errors;
  }
  fs::remove_all(model);
  const Result<nlohmann::json> completions = read_json_file(stem + "_completions.json");
  const Result<nlohmann::json> chat = read_json_file(stem + "_chat.json");
  fs::remove(stem + "_completions.json");
  fs::remove(stem + "_chat.json");
  ASSERT_TRUE(completions.ok()) << completions.status().to_string();
  ASSERT_TRUE(chat.ok()) << chat.status().to_string();

  const std::vector<int> prompt_tokens = {14, 13, 21, 12};  // kFixtureCounts of the kept four
  const std::vector<int> reply_tokens = {38, 35, 46, 21};
  EXPECT_EQ((*completions)["input_lens"].get<std::vector<int>>(), prompt_tokens);
  const std::vector<int> chat_input = (*chat)["input_lens"].get<std::vector<int>>();
  ASSERT_EQ(chat_input.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_GT(chat_input[i], prompt_tokens[i]);
    EXPECT_EQ(chat_input[i] - prompt_tokens[i], chat_input[0] - prompt_tokens[0]) << i;
  }
  EXPECT_EQ((*completions)["backend"], "openai");
  EXPECT_EQ((*chat)["backend"], "openai-chat");
  EXPECT_EQ((*chat)["config"]["endpoint"], "/v1/chat/completions");

  for (const nlohmann::json* run : {&*completions, &*chat}) {
    const nlohmann::json& json = *run;
    SCOPED_TRACE(json["backend"].dump());
    EXPECT_EQ(json["completed"], 4);
    EXPECT_EQ(json["failed"], 0);
    EXPECT_EQ(json["output_lens"].get<std::vector<int>>(), reply_tokens);
    EXPECT_EQ(json["config"]["dataset"], "sharegpt");
    EXPECT_EQ(json["tokenizer_id"], model.string());
    EXPECT_EQ(json["num_prompts"], 4);
    EXPECT_EQ(json["request_rate"], 50.0);
    EXPECT_EQ(json["burstiness"], 0.5);
    EXPECT_EQ(json["max_concurrency"], 2);
    EXPECT_EQ(json["slo"]["e2el_ms"], 120000.0);

    // vLLM's figures against the file's own summary.
    const double duration = json["duration"];
    EXPECT_EQ(duration, json["duration_s"].get<double>());
    EXPECT_NEAR(json["request_throughput"].get<double>(), 4 / duration, 1e-9);
    EXPECT_NEAR(
        json["total_token_throughput"].get<double>(),
        (json["total_input_tokens"].get<double>() + json["total_output_tokens"].get<double>()) /
            duration,
        1e-9);
    EXPECT_EQ(json["request_goodput"].get<double>(), json["goodput"].get<double>());
    for (const char* metric : {"ttft", "tpot", "itl"}) {
      const nlohmann::json& summary = json[std::string(metric) + "_ms"];
      EXPECT_NEAR(json["mean_" + std::string(metric) + "_ms"].get<double>(),
                  summary["mean"].get<double>(), 1e-9)
          << metric;
      EXPECT_NEAR(json["median_" + std::string(metric) + "_ms"].get<double>(),
                  summary["p50"].get<double>(), 1e-9)
          << metric;
      EXPECT_NEAR(json["p50_" + std::string(metric) + "_ms"].get<double>(),
                  summary["p50"].get<double>(), 1e-9)
          << metric;
      EXPECT_LE(json["p99.9_" + std::string(metric) + "_ms"].get<double>(),
                summary["max"].get<double>() + 1e-9)
          << metric;
      EXPECT_FALSE(json.contains("p99_" + std::string(metric) + "_ms")) << metric;
    }
    EXPECT_NEAR(json["mean_e2el_ms"].get<double>(), json["e2e_ms"]["mean"].get<double>(), 1e-9);

    // Per request: seconds in vLLM's lists, ms in the records; std recomputed from them.
    std::vector<double> e2el;
    for (size_t i = 0; i < 4; ++i) {
      const nlohmann::json& record = json["requests"][i];
      EXPECT_NEAR(json["ttfts"][i].get<double>() * 1e3, record["ttft_ms"].get<double>(), 1e-9);
      EXPECT_NEAR(json["latencies"][i].get<double>() * 1e3, record["e2e_ms"].get<double>(), 1e-9);
      EXPECT_NEAR(json["start_times"][i].get<double>() * 1e3, record["start_ms"].get<double>(),
                  1e-9);
      ASSERT_EQ(json["itls"][i].size(), record["itl_ms"].size());
      for (size_t k = 0; k < record["itl_ms"].size(); ++k) {
        EXPECT_NEAR(json["itls"][i][k].get<double>() * 1e3, record["itl_ms"][k].get<double>(),
                    1e-9);
      }
      EXPECT_EQ(json["input_lens"][i], record["prompt_tokens"]);
      EXPECT_EQ(json["errors"][i], "");
      EXPECT_FALSE(json["generated_texts"][i].get<std::string>().empty());
      e2el.push_back(record["e2e_ms"]);
    }
    const double mean_e2el = mean_of(e2el);
    double squares = 0;
    for (double value : e2el) squares += (value - mean_e2el) * (value - mean_e2el);
    EXPECT_NEAR(json["std_e2el_ms"].get<double>(), std::sqrt(squares / 4), 1e-9);
  }
}

// Multi-turn conversations against the real server (its chat template and tokenizer): every
// turn completes, and each prompt holds the one before it plus at least the new user message
// (one token or more a word).
TEST(Live, MultiTurnPromptsGrowTurnByTurn) {
  const fs::path model = make_tiny_model();
  const std::string result_path = (fs::temp_directory_path() / ("bench_serving_multiturn_" +
                                                                std::to_string(getpid()) + ".json"))
                                      .string();
  {
    LiveServer server(model);
    const Result<std::string> base_url = base_url_of(server);
    ASSERT_TRUE(base_url.ok()) << base_url.status().to_string();
    std::string errors;
    ASSERT_EQ(run_binary("--base-url " + *base_url +
                             " --endpoint /v1/chat/completions --dataset-name multiturn"
                             " --num-turns 3 --num-prompts 2 --input-len 6 --output-len 4"
                             " --shared-prefix-len 5 --max-concurrency 2 --result-json " +
                             result_path,
                         errors),
              0)
        << errors;
  }
  fs::remove_all(model);
  const Result<nlohmann::json> result = read_json_file(result_path);
  fs::remove(result_path);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ((*result)["config"]["dataset"], "multiturn");
  EXPECT_EQ((*result)["config"]["num_turns"], 3);
  const nlohmann::json& requests = (*result)["requests"];
  ASSERT_EQ(requests.size(), 6u);
  for (size_t index = 0; index < requests.size(); ++index) {
    ASSERT_TRUE(requests[index]["success"].get<bool>()) << requests[index]["error"];
    EXPECT_EQ(requests[index]["output_tokens"], 4);
    if (index % 3 > 0) {
      EXPECT_GE(requests[index]["prompt_tokens"].get<int>(),
                requests[index - 1]["prompt_tokens"].get<int>() + 6)
          << index;
    }
  }
}

}  // namespace
}  // namespace pdserve::bench
