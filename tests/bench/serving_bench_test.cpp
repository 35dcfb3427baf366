// Tests of pdserve-bench-serving: percentile math against numpy's values, the workload's
// properties (uniform and ShareGPT-like lengths, JSONL prompt files), flag validation (exit 2),
// failures of a server that dies or stalls mid-stream, a server timeline copied into the JSON,
// and live runs against pdserve-decode on the tiny model: exact token counts, and a
// --result-json whose per-request records reproduce its summary.
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
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>

#include "bench/serving/latency_stats.h"
#include "bench/serving/prompt_file.h"
#include "bench/serving/serving_benchmark.h"
#include "bench/serving/workload.h"
#include "common/core/files.h"

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

  summarize_outcomes(result, Slo{.ttft_ms = 0, .tpot_ms = 350});  // recomputed, TPOT only
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

// A server on a free port that answers each connection with `respond` on its own thread.
class FakeServer {
 public:
  explicit FakeServer(std::function<void(tcp::socket&)> respond)
      : acceptor_(io_, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0)),
        thread_([this, respond = std::move(respond)] {
          boost::system::error_code ec;
          for (;;) {
            tcp::socket socket(io_);
            acceptor_.accept(socket, ec);
            if (ec || stopping_) return;
            boost::asio::streambuf request;
            boost::asio::read_until(socket, request, "\r\n\r\n", ec);
            respond(socket);
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
  boost::asio::io_context io_;
  tcp::acceptor acceptor_;
  std::vector<tcp::socket> sockets_;
  std::atomic<bool> stopping_ = false;
  std::thread thread_;
};

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

}  // namespace
}  // namespace pdserve::bench
