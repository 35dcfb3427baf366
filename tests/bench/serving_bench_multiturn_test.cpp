// pdserve-bench-serving's multi-turn conversations: the workload, and the history each turn sends
// to a fake server after the previous answer.
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <boost/asio/write.hpp>
#include <nlohmann/json.hpp>

#include "bench/serving/serving_benchmark.h"
#include "bench/serving/workload.h"
#include "tests/bench/fake_bench_server.h"

namespace pdserve::bench {
namespace {

namespace fs = std::filesystem;
using tcp = boost::asio::ip::tcp;

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


}  // namespace
}  // namespace pdserve::bench
