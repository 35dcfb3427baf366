// The cluster's tokenizer at the proxy (issue #34): learned from the nodes that register
// (their advertised sha256, then GET /cluster/tokenizer), fixed with --tokenizer, off with
// --no-cache-aware-routing. Through a real ProxyServer, HttpServer and fake nodes serving the
// vendored Qwen3 tokenizer files. Oracles: Python's hashlib for the identity, and the property
// that a prompt goes to the decode node that reported holding its prefix (the keys chained by
// the test's own tokenizer, loaded from disk) once the proxy has a tokenizer, and by load
// otherwise.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/cluster/cluster_auth.h"
#include "common/engine/block_hash.h"
#include "common/http/http_client.h"
#include "common/http/http_server.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/tokenizer_files.h"
#include "proxy/proxy_server.h"

namespace pdserve::proxy {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr char kToken[] = "cluster-secret";
const std::filesystem::path kModelDir =
    std::filesystem::path(PDSERVE_ASSETS_DIR) / "qwen3-tokenizer";
// hashlib: sha256(sha256(tokenizer.json).hexdigest() + "\n" +
//                 sha256(tokenizer_config.json).hexdigest()) of configs/models/qwen3-tokenizer.
constexpr char kQwen3Identity[] =
    "d218d0d7f6b4d1a18593260937fbb8d58ffd02e4c4bcb61bf2ba74692d7261dd";
const std::string kOtherIdentity(64, 'a');
constexpr int kBlockSize = 16;

TEST(TokenizerFilesTest, IdentityIsTheSha256OfBothFilesAsHashlibComputesIt) {
  const Result<TokenizerFiles> files = TokenizerFiles::read(kModelDir);
  ASSERT_TRUE(files.ok()) << files.status().to_string();
  EXPECT_EQ(files->sha256(), kQwen3Identity);
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_TRUE(is_sha256_hex(kQwen3Identity));
  EXPECT_FALSE(is_sha256_hex(std::string(64, 'A')));
  EXPECT_FALSE(is_sha256_hex(std::string(63, 'a')));
  const Result<TokenizerFiles> round_trip = TokenizerFiles::parse(files->to_json());
  ASSERT_TRUE(round_trip.ok()) << round_trip.status().to_string();
  EXPECT_EQ(round_trip->sha256(), kQwen3Identity);
  EXPECT_FALSE(TokenizerFiles::parse(Json{{"tokenizer_json", 1}}).ok());
}

// A decode node: serves its tokenizer files (the cluster token required) and completions,
// counting both.
class FakeNode {
 public:
  explicit FakeNode(std::string files_body) : files_body_(std::move(files_body)) {
    http::RouteTable routes;
    routes.add("GET", "/cluster/tokenizer",
               guarded({kToken, {}}, RouteAccess::kCluster,
                       [this](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> ch) {
                         {
                           std::lock_guard lock(mutex_);
                           ++fetches_;
                           fetched_.notify_all();
                         }
                         ch->send({200, "application/json", {}, files_body_});
                       }));
    routes.add("POST", "/v1/completions",
               [this](const http::HttpRequest&, std::shared_ptr<http::ResponseChannel> ch) {
                 ++completions_;
                 ch->send({200, "application/json", {}, R"({"choices":[{"text":"ok"}]})"});
               });
    server_ = std::move(http::HttpServer::start({}, std::move(routes)).value());
  }
  ~FakeNode() { server_->stop(); }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  int completions() const { return completions_; }
  // Waits (at most 60 s) until the proxy fetched the files `count` times.
  bool wait_for_fetches(int count) {
    std::unique_lock lock(mutex_);
    return fetched_.wait_for(lock, 60s, [&] { return fetches_ >= count; });
  }
  int fetches() {
    std::lock_guard lock(mutex_);
    return fetches_;
  }

 private:
  const std::string files_body_;
  std::atomic<int> completions_{0};
  std::mutex mutex_;
  std::condition_variable fetched_;
  int fetches_ = 0;
  std::unique_ptr<http::HttpServer> server_;
};

std::string qwen3_files_body() {
  return TokenizerFiles::read(kModelDir).value().to_json().dump();
}

// A prompt of many blocks, as text.
std::string long_prompt() {
  std::string text;
  for (int line = 0; line < 40; ++line) {
    text += "Line " + std::to_string(line) + ": the quick brown fox jumps over the lazy dog.\n";
  }
  return text;
}

class ClusterTokenizerTest : public ::testing::Test {
 protected:
  void start_proxy(ClusterTokenizerOptions tokenizer) {
    client_ = std::move(http::HttpClient::create(2).value());
    ProxyOptions options;
    options.access.cluster_token = kToken;
    options.tokenizer = std::move(tokenizer);
    proxy_ = std::make_unique<ProxyServer>(registry_, *client_, options);
    http::RouteTable routes;
    proxy_->register_routes(routes);
    server_ = std::move(http::HttpServer::start({}, std::move(routes)).value());
    base_ = http::parse_base_url("http://127.0.0.1:" + std::to_string(server_->port())).value();
  }
  void TearDown() override {
    if (server_) server_->stop();
    proxy_.reset();  // before the client its exchanges use
    client_.reset();
  }

  http::ClientResponse call(std::string method, std::string target, std::string body) {
    http::ClientRequest request;
    request.method = std::move(method);
    request.target = std::move(target);
    request.body = std::move(body);
    request.headers.emplace_back("Authorization", cluster_auth_header_value(kToken));
    request.timeout = 60s;
    Result<http::ClientResponse> response = client_->fetch_and_wait(base_, std::move(request));
    EXPECT_TRUE(response.ok()) << response.status().to_string();
    return response.ok() ? std::move(*response) : http::ClientResponse{};
  }

  // POST /cluster/nodes for a decode node at `url` advertising `sha256` ("": none).
  http::ClientResponse register_node(const std::string& url, const std::string& sha256) {
    Json body = {{"role", "decode"}, {"url", url}, {"model", "m"}, {"kv_blocks_total", 100}};
    if (!sha256.empty()) body["tokenizer_sha256"] = sha256;
    return call("POST", "/cluster/nodes", body.dump());
  }

  std::string registered_id(const http::ClientResponse& response) {
    EXPECT_EQ(response.status, 200) << response.body;
    return response.status == 200 ? Json::parse(response.body)["id"].get<std::string>() : "";
  }

  // Node `id` reports holding every full block of `prompt` (its keys chained from the ids of
  // the test's own tokenizer), or nothing.
  void heartbeat(const std::string& id, const std::string& prompt) {
    std::vector<std::string> keys;
    if (!prompt.empty()) {
      static const Tokenizer tokenizer = Tokenizer::from_model_dir(kModelDir).value();
      const std::vector<int32_t> ids = tokenizer.encode(prompt).value();
      uint64_t parent = kRootBlockHash;
      for (size_t end = kBlockSize; end <= ids.size(); end += kBlockSize) {
        parent = hash_block_tokens(parent, std::span(ids).subspan(end - kBlockSize, kBlockSize));
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(parent));
        keys.push_back(hex);
      }
    }
    const Json body = {{"load", {{"kv_blocks_total", 100}, {"kv_blocks_used", 0}}},
                       {"prefix_cache",
                        {{"block_size", kBlockSize},
                         {"reset", true},
                         {"stored", keys},
                         {"removed", Json::array()}}}};
    ASSERT_TRUE(registry_.heartbeat(id, body, Clock::now()).ok());
  }

  // Two decode nodes registered with the Qwen3 identity; the second one holds `prompt`.
  void two_nodes_second_holding(FakeNode& first, FakeNode& second, const std::string& prompt) {
    first_id_ = registered_id(register_node(first.url(), kQwen3Identity));
    second_id_ = registered_id(register_node(second.url(), kQwen3Identity));
    heartbeat(first_id_, "");
    heartbeat(second_id_, prompt);
  }

  void complete(const std::string& prompt) {
    const http::ClientResponse response =
        call("POST", "/v1/completions", Json{{"prompt", prompt}, {"max_tokens", 1}}.dump());
    EXPECT_EQ(response.status, 200) << response.body;
  }

  static RegistryOptions registry_options() {
    RegistryOptions options;
    options.heartbeat_timeout = std::chrono::minutes(10);  // heartbeats are sent by hand
    return options;
  }

  NodeRegistry registry_{registry_options()};
  std::unique_ptr<http::HttpClient> client_;
  std::unique_ptr<ProxyServer> proxy_;
  std::unique_ptr<http::HttpServer> server_;
  http::BaseUrl base_;
  std::string first_id_, second_id_;
};

double metric_value(ProxyServer& proxy, const std::string& series) {
  const std::string text = proxy.metrics().render();
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1.0;
  return std::stod(text.substr(at + series.size() + 2));
}

TEST_F(ClusterTokenizerTest, LearnsTheTokenizerFromANodeThenPlacesByPrefix) {
  start_proxy({});
  EXPECT_EQ(proxy_->placement().tokenizer().state(), TokenizerState::kUnknown);
  FakeNode first(qwen3_files_body()), second(qwen3_files_body());
  const std::string prompt = long_prompt();
  two_nodes_second_holding(first, second, prompt);
  ASSERT_TRUE(proxy_->placement().tokenizer().wait_until_ready(Clock::now() + 60s));
  EXPECT_EQ(first.fetches() + second.fetches(), 1);  // fetched once, from one node
  EXPECT_EQ(metric_value(*proxy_, "pdserve:proxy_cache_aware_routing"), 1.0);
  for (int repeat = 0; repeat < 3; ++repeat) complete(prompt);
  // Both idle: only the prefix tells them apart.
  EXPECT_EQ(second.completions(), 3);
  EXPECT_EQ(first.completions(), 0);
  EXPECT_GT(metric_value(*proxy_, "pdserve:proxy_prefix_hit_blocks_total{pool=\"decode\"}"), 0.0);
}

TEST_F(ClusterTokenizerTest, WithoutATokenizerYetRequestsArePlacedByLoad) {
  ClusterTokenizerOptions tokenizer;
  tokenizer.retry_delay = 10ms;
  start_proxy(tokenizer);
  // The node advertises the Qwen3 identity but serves other files: every fetch fails the check.
  TokenizerFiles wrong = TokenizerFiles::read(kModelDir).value();
  wrong.tokenizer_config_json += " ";
  FakeNode first(wrong.to_json().dump()), second(wrong.to_json().dump());
  const std::string prompt = long_prompt();
  two_nodes_second_holding(first, second, prompt);
  // Two fetches seen by the nodes: the first one's failure was counted before the second.
  ASSERT_TRUE(first.wait_for_fetches(1) && second.wait_for_fetches(1));
  EXPECT_GE(metric_value(*proxy_, "pdserve:proxy_tokenizer_fetch_failures_total"), 1.0);
  EXPECT_NE(proxy_->placement().tokenizer().state(), TokenizerState::kReady);
  EXPECT_EQ(metric_value(*proxy_, "pdserve:proxy_cache_aware_routing"), 0.0);
  complete(prompt);  // the feature is lost, not the request
  EXPECT_EQ(first.completions() + second.completions(), 1);
  EXPECT_EQ(metric_value(*proxy_, "pdserve:proxy_prefix_query_blocks_total{pool=\"decode\"}"), 0.0);
}

TEST_F(ClusterTokenizerTest, ANodeWithAnotherTokenizerIsRefused) {
  start_proxy({});
  FakeNode first(qwen3_files_body()), other(qwen3_files_body()), legacy(qwen3_files_body());
  registered_id(register_node(first.url(), kQwen3Identity));  // the cluster's identity now
  const http::ClientResponse refused = register_node(other.url(), kOtherIdentity);
  EXPECT_EQ(refused.status, 409) << refused.body;
  const Json error = Json::parse(refused.body)["error"];
  EXPECT_NE(error["message"].get<std::string>().find(kOtherIdentity), std::string::npos)
      << refused.body;
  EXPECT_NE(error["message"].get<std::string>().find(kQwen3Identity), std::string::npos);
  EXPECT_TRUE(error.contains("type") && error.contains("code")) << refused.body;
  EXPECT_EQ(metric_value(*proxy_, "pdserve:proxy_tokenizer_mismatch_total"), 1.0);
  EXPECT_EQ(registry_.to_json(Clock::now())["nodes"].size(), 1u);
  // A node that advertises nothing is let in unchecked; a malformed identity is a 400.
  registered_id(register_node(legacy.url(), ""));
  EXPECT_EQ(register_node(other.url(), "not-a-sha256").status, 400);
}

TEST_F(ClusterTokenizerTest, WithTokenizerFlagNodesMustMatchIt) {
  ClusterTokenizerOptions tokenizer;
  tokenizer.fixed = std::make_shared<const PromptTokenizer>(
      PromptTokenizer::load(kModelDir, tokenizer.max_text_bytes).value());
  tokenizer.fixed_sha256 = kQwen3Identity;
  start_proxy(tokenizer);
  EXPECT_EQ(proxy_->placement().tokenizer().state(), TokenizerState::kReady);
  FakeNode first(qwen3_files_body()), second(qwen3_files_body());
  EXPECT_EQ(register_node(first.url(), kOtherIdentity).status, 409);
  const std::string prompt = long_prompt();
  two_nodes_second_holding(first, second, prompt);
  complete(prompt);
  EXPECT_EQ(second.completions(), 1);
  EXPECT_EQ(first.fetches() + second.fetches(), 0);  // nothing to fetch
}

TEST_F(ClusterTokenizerTest, NoCacheAwareRoutingTurnsItOff) {
  ClusterTokenizerOptions tokenizer;
  tokenizer.enabled = false;
  start_proxy(tokenizer);
  FakeNode first(qwen3_files_body()), second(qwen3_files_body());
  const std::string prompt = long_prompt();
  two_nodes_second_holding(first, second, prompt);
  EXPECT_EQ(proxy_->placement().tokenizer().state(), TokenizerState::kOff);
  // Nothing is checked either: another identity registers.
  FakeNode other(qwen3_files_body());
  heartbeat(registered_id(register_node(other.url(), kOtherIdentity)), prompt);
  complete(prompt);
  // By load alone (all idle, same KV usage): the prefix the second node holds counts for nothing.
  EXPECT_EQ(second.completions() + other.completions(), 0);
  EXPECT_EQ(first.completions(), 1);
  EXPECT_EQ(first.fetches() + second.fetches() + other.fetches(), 0);
  EXPECT_EQ(metric_value(*proxy_, "pdserve:proxy_prefix_query_blocks_total{pool=\"decode\"}"), 0.0);
  EXPECT_EQ(metric_value(*proxy_, "pdserve:proxy_cache_aware_routing"), 0.0);
}

}  // namespace
}  // namespace pdserve::proxy
