// The OpenAI API server over a fake InferenceService with scripted output, through real
// sockets.
#include "decode_node/api_server.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/engine/inference_service.h"
#include "common/http/http_server.h"
#include "tests/http/test_client.h"

namespace pdserve {
namespace {

using namespace std::chrono_literals;
using testing::make_request;
using testing::TestClient;
using Json = nlohmann::json;

// Every request produces the pieces of `script` (one token each), up to max_tokens, on its own
// engine thread; the final delta says kStop when the script ran out, kLength otherwise.
class FakeService : public InferenceService {
 public:
  explicit FakeService(std::vector<std::string> script) : script_(std::move(script)) {
    info_.name = "fake-model";
    info_.max_model_len = 64;
    info_.vocab_size = 151936;
    thread_ = std::thread([this] { run(); });
  }
  ~FakeService() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  Status submit(InferenceRequest request, DeltaSink sink) override {
    std::lock_guard lock(mutex_);
    if (queue_full_) return resource_exhausted("the waiting queue is full");
    submitted_.push_back(request.id);
    jobs_.push_back({std::move(request), std::move(sink), 0});
    cv_.notify_all();
    return Status();
  }
  void abort(const std::string& id) override {
    std::lock_guard lock(mutex_);
    aborted_.insert(id);
  }
  ServiceStats stats() const override { return {}; }
  const ModelInfo& model_info() const override { return info_; }

  void set_queue_full(bool full) {
    std::lock_guard lock(mutex_);
    queue_full_ = full;
  }
  void set_step_delay(std::chrono::milliseconds delay) { step_delay_ = delay; }
  std::vector<std::string> submitted() {
    std::lock_guard lock(mutex_);
    return submitted_;
  }
  std::set<std::string> aborted() {
    std::lock_guard lock(mutex_);
    return aborted_;
  }

 private:
  struct Job {
    InferenceRequest request;
    DeltaSink sink;
    size_t produced;
  };

  void run() {
    std::unique_lock lock(mutex_);
    while (true) {
      cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping and drained
      Job job = std::move(jobs_.front());
      jobs_.pop_front();
      const bool aborted = aborted_.count(job.request.id) > 0 || stopping_;
      lock.unlock();
      step(job, aborted);
      lock.lock();
    }
  }

  // Emits one delta; requeues the job when it is not finished.
  void step(Job& job, bool aborted) {
    SequenceDelta delta;
    delta.request_id = job.request.id;
    delta.prompt_tokens = static_cast<int>(job.request.prompt_tokens.size());
    if (aborted) {
      delta.finished = true;
      delta.error = cancelled("aborted");
      job.sink(std::move(delta));
      return;
    }
    std::this_thread::sleep_for(step_delay_);
    delta.text = script_[job.produced];
    delta.token_ids = {static_cast<int32_t>(job.produced)};
    ++job.produced;
    delta.completion_tokens = static_cast<int>(job.produced);
    if (job.produced == script_.size()) {
      delta.finished = true;
      delta.finish_reason = FinishReason::kStop;
    } else if (static_cast<int>(job.produced) >= job.request.sampling.max_tokens) {
      delta.finished = true;
      delta.finish_reason = FinishReason::kLength;
    }
    const bool finished = delta.finished;
    job.sink(std::move(delta));
    if (!finished) {
      std::lock_guard lock(mutex_);
      jobs_.push_back(std::move(job));
      cv_.notify_all();
    }
  }

  const std::vector<std::string> script_;
  ModelInfo info_;
  std::chrono::milliseconds step_delay_{0};
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  std::vector<std::string> submitted_;
  std::set<std::string> aborted_;
  bool queue_full_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

const Tokenizer& tokenizer() {
  static const Tokenizer instance =
      Tokenizer::from_model_dir(PDSERVE_ASSETS_DIR "/qwen3-tokenizer").value();
  return instance;
}
const ChatTemplate& chat_template() {
  static const ChatTemplate instance =
      ChatTemplate::from_tokenizer_config(PDSERVE_ASSETS_DIR
                                          "/qwen3-tokenizer/tokenizer_config.json")
          .value();
  return instance;
}

class ApiServerTest : public ::testing::Test {
 protected:
  void start(std::vector<std::string> script) {
    service_ = std::make_unique<FakeService>(std::move(script));
    api_ = std::make_unique<ApiServer>(*service_, tokenizer(), chat_template());
    http::Router router;
    api_->register_routes(router);
    server_ = http::HttpServer::start({}, std::move(router)).value();
  }
  ~ApiServerTest() override {
    if (server_) server_->stop();
  }

  testing::HttpResponseMessage post(const std::string& path, const std::string& body) {
    TestClient client(server_->port());
    EXPECT_TRUE(client.send(make_request("POST", path, body)));
    auto response = client.read_response();
    EXPECT_TRUE(response);
    return response ? *response : testing::HttpResponseMessage{};
  }

  // The JSON payloads of "data: ..." events, and whether the stream ended with [DONE].
  static std::vector<Json> sse_events(const std::string& body, bool& done) {
    std::vector<Json> events;
    done = false;
    size_t at = 0;
    while (at < body.size()) {
      const size_t end = body.find("\n\n", at);
      EXPECT_NE(end, std::string::npos) << "unterminated event";
      if (end == std::string::npos) break;
      const std::string event = body.substr(at, end - at);
      EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
      EXPECT_FALSE(done) << "event after [DONE]";
      if (event == "data: [DONE]") {
        done = true;
      } else {
        events.push_back(Json::parse(event.substr(6)));
      }
      at = end + 2;
    }
    return events;
  }

  std::unique_ptr<FakeService> service_;
  std::unique_ptr<ApiServer> api_;
  std::unique_ptr<http::HttpServer> server_;
};

TEST_F(ApiServerTest, CompletionWithEchoAndUsage) {
  start({"Hello", " world", "!"});
  auto response =
      post("/v1/completions", R"({"model": "fake-model", "prompt": "Say hi", "echo": true})");
  ASSERT_EQ(response.result_int(), 200) << response.body();
  const Json body = Json::parse(response.body());
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], "Say hiHello world!");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["prompt_tokens"], tokenizer().encode("Say hi").value().size());
  EXPECT_EQ(body["usage"]["completion_tokens"], 3);
}

TEST_F(ApiServerTest, PromptListAndNFanOutIntoOneEngineRequestPerChoice) {
  start({"a", "b", "c", "d"});
  auto response =
      post("/v1/completions", R"({"prompt": ["one", "two three"], "n": 2, "max_tokens": 2})");
  ASSERT_EQ(response.result_int(), 200) << response.body();
  const Json body = Json::parse(response.body());
  ASSERT_EQ(body["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(body["choices"][i]["index"], i);
    EXPECT_EQ(body["choices"][i]["text"], "ab");
    EXPECT_EQ(body["choices"][i]["finish_reason"], "length");
  }
  EXPECT_EQ(service_->submitted().size(), 4u);
  // Prompt tokens count once per prompt, completion tokens once per choice.
  EXPECT_EQ(body["usage"]["prompt_tokens"], tokenizer().encode("one").value().size() +
                                                tokenizer().encode("two three").value().size());
  EXPECT_EQ(body["usage"]["completion_tokens"], 8);
}

TEST_F(ApiServerTest, StreamingChatSplitsReasoningAndEndsWithUsageAndDone) {
  start({"<think>", "\nponder", "\n</think>", "\n\nAnswer", "."});
  auto response = post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "q"}],
      "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_EQ(response.result_int(), 200) << response.body();
  EXPECT_EQ(response["Content-Type"], "text/event-stream");
  bool done = false;
  const std::vector<Json> events = sse_events(response.body(), done);
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
  std::string reasoning, content;
  std::string finish;
  for (const Json& event : events) {
    EXPECT_EQ(event["object"], "chat.completion.chunk");
    if (event["choices"].empty()) continue;
    const Json& choice = event["choices"][0];
    if (choice["delta"].contains("reasoning_content"))
      reasoning += choice["delta"]["reasoning_content"];
    if (choice["delta"].contains("content")) content += choice["delta"]["content"];
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  EXPECT_EQ(reasoning, "ponder");
  EXPECT_EQ(content, "Answer.");
  EXPECT_EQ(finish, "stop");
  EXPECT_TRUE(events.back()["choices"].empty());
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 5);
}

TEST_F(ApiServerTest, NonStreamingChatReturnsReasoningContent) {
  start({"<think>", "why", "</think>", "because"});
  auto response =
      post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "q"}]})");
  ASSERT_EQ(response.result_int(), 200) << response.body();
  const Json message = Json::parse(response.body())["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "why");
  EXPECT_EQ(message["content"], "because");
}

TEST_F(ApiServerTest, ErrorPaths) {
  start({"x"});
  struct Case {
    std::string path, body;
    int status;
    std::string param_or_code;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", R"({"prompt": "a",)", 400, ""},
      {"/v1/completions", R"({"prompt": 5})", 400, "prompt"},
      {"/v1/completions", R"({"prompt": "a", "temprature": 1})", 400, ""},
      {"/v1/completions", R"({"prompt": "a", "model": "other"})", 404, "model_not_found"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 1000})", 400, ""},
      {"/v1/chat/completions", R"({"messages": "hi"})", 400, "messages"},
  };
  for (const Case& c : cases) {
    auto response = post(c.path, c.body);
    EXPECT_EQ(response.result_int(), c.status) << c.body << " -> " << response.body();
    const Json error = Json::parse(response.body())["error"];
    EXPECT_TRUE(error.contains("message") && error.contains("type")) << response.body();
    if (!c.param_or_code.empty()) {
      EXPECT_TRUE(error["param"] == c.param_or_code || error["code"] == c.param_or_code)
          << response.body();
    }
  }
  EXPECT_TRUE(service_->submitted().empty());
}

TEST_F(ApiServerTest, QueueFullIs429WithRetryAfter) {
  start({"x"});
  service_->set_queue_full(true);
  auto response = post("/v1/completions", R"({"prompt": "a"})");
  EXPECT_EQ(response.result_int(), 429);
  EXPECT_EQ(response["Retry-After"], "1");
  EXPECT_EQ(Json::parse(response.body())["error"]["type"], "rate_limit_error");
}

TEST_F(ApiServerTest, DisconnectAbortsEveryFannedOutRequest) {
  std::vector<std::string> long_script(60, "t");
  start(long_script);
  service_->set_step_delay(20ms);
  TestClient client(server_->port());
  ASSERT_TRUE(client.send(make_request("POST", "/v1/completions",
                                       R"({"prompt": ["a", "b"], "n": 2, "max_tokens": 50,
                                           "stream": true})")));
  ASSERT_TRUE(client.read_response_header());
  EXPECT_FALSE(client.read_some(64, 2000ms).empty());
  client.close();
  const auto deadline = std::chrono::steady_clock::now() + 3s;
  while (service_->aborted().size() < 4 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  const std::vector<std::string> submitted = service_->submitted();
  ASSERT_EQ(submitted.size(), 4u);
  EXPECT_EQ(service_->aborted(), std::set<std::string>(submitted.begin(), submitted.end()));
}

TEST_F(ApiServerTest, ModelsHealthAndMetrics) {
  start({"x"});
  TestClient client(server_->port());
  ASSERT_TRUE(client.send(make_request("GET", "/v1/models")));
  auto models = client.read_response();
  ASSERT_TRUE(models);
  EXPECT_EQ(Json::parse(models->body())["data"][0]["id"], "fake-model");
  ASSERT_TRUE(client.send(make_request("GET", "/health")));
  auto health = client.read_response();
  ASSERT_TRUE(health);
  EXPECT_EQ(health->result_int(), 200);
  ASSERT_TRUE(client.send(make_request("GET", "/metrics")));
  auto metrics = client.read_response();
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body().find("pdserve:http_requests_total{status=\"200\"} 3"),
            std::string::npos)
      << metrics->body();
  EXPECT_NE(metrics->body().find("# TYPE pdserve:num_requests_running gauge"), std::string::npos);
}

}  // namespace
}  // namespace pdserve
