// pdserve-bench-serving against pdserve-decode on the tiny model: exact token counts, a
// --result-json whose per-request records reproduce its summary, ShareGPT on /v1/completions and
// /v1/chat/completions, and multi-turn conversations whose prompts grow turn by turn.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "bench/serving/serving_benchmark.h"
#include "common/core/files.h"
#include "tests/bench/serving_bench_fixtures.h"

namespace pdserve::bench {
namespace {

namespace fs = std::filesystem;

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
