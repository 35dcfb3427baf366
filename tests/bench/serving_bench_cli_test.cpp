// pdserve-bench-serving's command line: --base-url parsing, and bad flags or bad vLLM-style input
// that exit 2 with a message before any request.
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "bench/serving/serving_benchmark.h"
#include "tests/bench/fake_bench_server.h"
#include "tests/bench/serving_bench_fixtures.h"

namespace pdserve::bench {
namespace {

namespace fs = std::filesystem;
using tcp = boost::asio::ip::tcp;

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

}  // namespace
}  // namespace pdserve::bench
