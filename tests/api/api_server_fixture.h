// The fixture of the OpenAI API server tests: an OpenAiServer over a FakeService, served on a
// real socket, and the helpers that read its answers (SSE events, /metrics samples).
#pragma once

#include <cstdlib>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/http/http_server.h"
#include "serving/openai/openai_server.h"
#include "tests/api/fake_inference_service.h"
#include "tests/http/test_client.h"

namespace pdserve::api_test {

using testing::make_request;
using testing::TestClient;
using Json = nlohmann::json;

inline const Tokenizer& tokenizer() {
  static const Tokenizer instance =
      Tokenizer::from_model_dir(PDSERVE_ASSETS_DIR "/qwen3-tokenizer").value();
  return instance;
}
inline const ChatTemplate& chat_template() {
  static const ChatTemplate instance =
      ChatTemplate::from_tokenizer_config(PDSERVE_ASSETS_DIR
                                          "/qwen3-tokenizer/tokenizer_config.json")
          .value();
  return instance;
}


// "Hello", the lone byte 0xE4 (the lead byte of a three-byte character: no text of its own,
// partial UTF-8 as a token string), " world".
inline const std::vector<std::string> kHelloWorldScript = {"Hello", "", " world"};

// The value of one sample (name plus rendered labels) in a /metrics body.
inline std::optional<double> metric_value(const std::string& body, const std::string& series) {
  std::istringstream lines(body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ') {
      return std::strtod(line.c_str() + series.size() + 1, nullptr);
    }
  }
  return std::nullopt;
}

// The labels of the fake model's vLLM series, and the same with one more label.
inline const std::string kVllmLabels = "{model_name=\"fake-model\",engine=\"0\"}";
inline std::string vllm_labels_and(const std::string& label) {
  return kVllmLabels.substr(0, kVllmLabels.size() - 1) + "," + label + "}";
}

class ApiServerTest : public ::testing::Test {
 protected:
  void start(std::vector<std::string> script, OpenAiOptions options = {}) {
    service_ = std::make_unique<FakeService>(std::move(script));
    api_ = std::make_unique<OpenAiServer>(*service_, tokenizer(), chat_template(), options);
    http::RouteTable router;
    api_->register_routes(router);
    server_ = http::HttpServer::start({}, std::move(router)).value();
  }
  // The service delivers its last deltas (which reach the OpenAiServer) before the OpenAiServer
  // goes away.
  ~ApiServerTest() override {
    if (server_) server_->stop();
    service_.reset();
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

  std::string scrape_metrics() {
    TestClient client(server_->port());
    EXPECT_TRUE(client.send(make_request("GET", "/metrics")));
    auto response = client.read_response();
    EXPECT_TRUE(response);
    return response ? response->body() : std::string();
  }

  std::unique_ptr<FakeService> service_;
  std::unique_ptr<OpenAiServer> api_;
  std::unique_ptr<http::HttpServer> server_;
};

}  // namespace pdserve::api_test
