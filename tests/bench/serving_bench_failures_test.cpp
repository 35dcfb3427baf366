// pdserve-bench-serving against servers that fail: one that dies mid-stream, one that answers
// with an error status, one that stalls; and a server's timeline copied into the JSON records;
// 429 answers retried (--retry-429).
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <boost/asio/write.hpp>

#include "bench/serving/serving_benchmark.h"
#include "bench/serving/workload.h"
#include "tests/bench/fake_bench_server.h"

namespace pdserve::bench {
namespace {

namespace fs = std::filesystem;
using tcp = boost::asio::ip::tcp;

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
  EXPECT_EQ(result->outcomes[0].http_status, 429);
  EXPECT_EQ(result->outcomes[0].retry_after_s, 1.0);
  EXPECT_EQ(result->outcomes[0].retries, 0);  // without --retry-429 a 429 fails the request
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

// A 429 answer with `retry_after` ("" for none) as its Retry-After header.
std::string too_many_requests(const std::string& retry_after) {
  const std::string body = "{\"error\":{\"message\":\"no KV room now\"}}";
  return "HTTP/1.1 429 Too Many Requests\r\n" +
         (retry_after.empty() ? "" : "Retry-After: " + retry_after + "\r\n") +
         "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

// --retry-429: each request's first two sends get 429 (Retry-After: 0), the third its stream;
// every request completes, the retries are counted per request and in total, and the reported
// times start at the first send.
TEST(Retry429, ARefusedRequestIsSentAgainAfterItsRetryAfter) {
  std::atomic<int> connections = 0;
  FakeServer server([&](tcp::socket& socket) {
    const nlohmann::json usage = {
        {"prompt_tokens", 8}, {"completion_tokens", 4}, {"total_tokens", 12}};
    const std::string response =
        connections++ % 3 < 2 ? too_many_requests("0") : complete_stream(4, usage);
    boost::system::error_code ec;
    boost::asio::write(socket, boost::asio::buffer(response), ec);
  });
  RunOptions options;
  options.endpoint = server.endpoint();
  options.model = "m";
  options.max_concurrency = 1;  // in order, so that every request meets the 429, 429, 200 cycle
  options.request_timeout = std::chrono::seconds(20);
  options.retry_429_for = std::chrono::seconds(30);
  WorkloadOptions workload;
  workload.num_prompts = 2;
  workload.input_len = 8;
  workload.output_len = 4;
  workload.vocab_size = 1000;
  const Result<BenchmarkResult> result = run_benchmark(options, make_workload(workload).value());
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  ASSERT_EQ(result->completed, 2) << format_report(*result);
  EXPECT_EQ(connections.load(), 6);
  for (const RequestOutcome& outcome : result->outcomes) {
    EXPECT_EQ(outcome.retries, 2);
    EXPECT_EQ(outcome.http_status, 200);
    EXPECT_GE(outcome.e2e_s, outcome.ttft_s);
  }
  EXPECT_EQ(result->retries_429, 4);
  EXPECT_NE(format_report(*result).find("Retried HTTP 429 answers:"), std::string::npos)
      << format_report(*result);
  const nlohmann::json json = nlohmann::json::parse(result_json(*result, workload, options).dump());
  EXPECT_EQ(json["retries_429"], 4);
  EXPECT_EQ(json["requests"][1]["retries"], 2);
  EXPECT_EQ(json["config"]["retry_429_s"], 30.0);
}

// Without Retry-After the client backs off (0.5 s, then 1 s) and gives up when the next send
// would start after --retry-429's window: the request fails with the last 429, retries counted.
TEST(Retry429, ARequestStillRefusedAtItsRetryDeadlineFails) {
  std::atomic<int> connections = 0;
  FakeServer server([&](tcp::socket& socket) {
    ++connections;
    boost::system::error_code ec;
    boost::asio::write(socket, boost::asio::buffer(too_many_requests("")), ec);
  });
  RunOptions options;
  options.endpoint = server.endpoint();
  options.model = "m";
  options.request_timeout = std::chrono::seconds(20);
  options.retry_429_for = std::chrono::milliseconds(1200);
  const auto start = std::chrono::steady_clock::now();
  const Result<BenchmarkResult> result = run_benchmark(options, small_workload(1));
  ASSERT_TRUE(result.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(result->failed, 1);
  const RequestOutcome& outcome = result->outcomes[0];
  EXPECT_EQ(outcome.retries, 1);  // sent at 0 and 0.5 s; the next would be at 1.5 s
  EXPECT_EQ(connections.load(), 2);
  EXPECT_EQ(outcome.http_status, 429);
  EXPECT_GE(outcome.e2e_s, 0.5);  // from the first send
  EXPECT_NE(outcome.error.find("no KV room now"), std::string::npos) << outcome.error;
}

}  // namespace
}  // namespace pdserve::bench
