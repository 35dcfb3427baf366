// Through a real ProxyServer: a fake decode node that answers after a known delay and emits the
// spec's timeline; the proxy forwards traceparent and X-Pdserve-Timeline, strips the timeline
// comment, rewrites the usage timeline onto its clock, serves it on /trace (cluster token
// only) and in its histograms, and gives it to a client only when asked: whole to a cluster
// token holder, without node addresses and ids to anyone else.
#include <chrono>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "common/http/http_client.h"
#include "common/http/http_server.h"
#include "common/http/traceparent.h"
#include "proxy/proxy_server.h"

namespace pdserve::proxy {
namespace {

using Json = nlohmann::json;

constexpr double kHeadDelayMs = 40.0;
constexpr char kToken[] = "cluster-secret";
const http::HeaderList kWithToken = {{"Authorization", "Bearer cluster-secret"}};

// A decode node that waits kHeadDelayMs, then answers with its timeline (head_sent_ms =
// the measured wait), streaming (split mid-event) or not.
class FakeDecodeNode {
 public:
  FakeDecodeNode() {
    http::RouteTable router;
    router.add("POST", "/v1/completions",
               [this](const http::HttpRequest& request, std::shared_ptr<http::ResponseChannel> ch) {
                 answer(request, ch);
               });
    server_ = std::move(http::HttpServer::start({}, std::move(router)).value());
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  http::HeaderList last_headers() {
    std::lock_guard lock(mutex_);
    return headers_;
  }

 private:
  void answer(const http::HttpRequest& request, const std::shared_ptr<http::ResponseChannel>& ch) {
    const auto arrival = std::chrono::steady_clock::now();
    {
      std::lock_guard lock(mutex_);
      headers_ = request.headers;
    }
    const Json body = Json::parse(request.body);
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(kHeadDelayMs));
    const double head_sent =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - arrival)
            .count();
    const std::string node = "decode " + url();
    const Json timeline = {
        {"version", 1},
        {"request_id", body.value("id", "cmpl-x")},
        {"trace_id", "ignored-by-the-proxy"},
        {"origin", "decode"},
        {"sync", {{"head_sent_ms", head_sent}}},
        {"spans",
         {{{"name", "decode.request"},
           {"node", node},
           {"start_ms", 0.0},
           {"end_ms", head_sent},
           {"args", {{"index", 0}}}},
          {{"name", "decode.queue"}, {"node", node}, {"start_ms", 0.0}, {"end_ms", 1.0}}}},
        {"tokens_ms", {head_sent - 1.0, head_sent}},
        {"output_tokens", 2},
        {"ttft_ms", head_sent - 1.0},
        {"tpot_ms", 1.0},
        {"e2e_ms", head_sent}};
    if (!body.value("stream", false)) {
      ch->send({200,
                "application/json",
                {},
                Json{{"id", timeline["request_id"]},
                     {"choices", {{{"text", "ab"}}}},
                     {"usage", {{"prompt_tokens", 3}, {"pdserve_timeline", timeline}}}}
                    .dump()});
      return;
    }
    ch->start_stream(200, "text/event-stream", {});
    ch->write("data: {\"choices\":[{\"text\":\"a\"}]}\n");
    ch->write("\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\n: pdserve_");
    ch->write("timeline " + timeline.dump().substr(0, 20));
    ch->write(timeline.dump().substr(20) + "\n\n");
    if (body.value("include_usage", false)) {
      ch->write("data: " +
                Json{{"choices", Json::array()},
                     {"usage", {{"prompt_tokens", 3}, {"pdserve_timeline", timeline}}}}
                    .dump() +
                "\n\n");
    }
    ch->write("data: [DONE]\n\n");
    ch->end_stream();
  }

  std::mutex mutex_;
  http::HeaderList headers_;
  std::unique_ptr<http::HttpServer> server_;
};

class ProxyTimeline : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(registry_.add_static(NodeRole::kDecode, decode_.url()).ok());
    client_ = std::move(http::HttpClient::create(2).value());
    ProxyOptions options;
    options.access.cluster_token = kToken;
    proxy_ = std::make_unique<ProxyServer>(registry_, *client_, options);
    http::RouteTable router;
    proxy_->register_routes(router);
    server_ = std::move(http::HttpServer::start({}, std::move(router)).value());
    base_ = http::parse_base_url("http://127.0.0.1:" + std::to_string(server_->port())).value();
  }
  void TearDown() override {
    server_->stop();
    client_.reset();
  }

  http::ClientResponse call(const std::string& method, const std::string& target,
                            const std::string& body = "", http::HeaderList headers = {}) {
    http::ClientRequest request;
    request.method = method;
    request.target = target;
    request.body = body;
    request.headers = std::move(headers);
    Result<http::ClientResponse> response = client_->fetch_and_wait(base_, std::move(request));
    EXPECT_TRUE(response.ok()) << response.status().to_string();
    return response.ok() ? std::move(*response) : http::ClientResponse{};
  }

  // The trace events of one request, by name.
  std::map<std::string, Json> trace_of(const std::string& id) {
    const http::ClientResponse response = call("GET", "/trace?request_id=" + id, "", kWithToken);
    EXPECT_EQ(response.status, 200) << response.body;
    std::map<std::string, Json> events;
    const Json document = Json::parse(response.body);
    for (const Json& event : document["traceEvents"]) {
      if (event["ph"] == "X") events[event["name"].get<std::string>()] = event;
    }
    return events;
  }

  FakeDecodeNode decode_;
  NodeRegistry registry_{RegistryOptions{}};
  std::unique_ptr<http::HttpClient> client_;
  std::unique_ptr<ProxyServer> proxy_;
  std::unique_ptr<http::HttpServer> server_;
  http::BaseUrl base_;
};

// The aligned timeline's decode spans sit between the upstream request and the proxy's end,
// shifted by about the (loopback, near zero) one-way delay, not by the node's head delay.
void expect_aligned(const Json& t, const std::string& trace_id) {
  EXPECT_EQ(t["origin"], "proxy");
  EXPECT_FALSE(t.contains("sync"));
  EXPECT_EQ(t["trace_id"], trace_id);
  double sent = 0, decode_start = -1, decode_end = -1, end = 0;
  for (const Json& span : t["spans"]) {
    if (span["name"] == "proxy.route") sent = span["end_ms"];
    if (span["name"] == "proxy.request") end = span["end_ms"];
    if (span["name"] == "decode.request") {
      decode_start = span["start_ms"];
      decode_end = span["end_ms"];
    }
  }
  EXPECT_GE(decode_start, sent);
  EXPECT_LT(decode_start, sent + 10.0);  // loopback: well under the 40 ms head delay
  EXPECT_GE(decode_end - decode_start, kHeadDelayMs);
  EXPECT_LE(decode_end, end + 1e-6);
  EXPECT_GE(t["ttft_ms"].get<double>(), kHeadDelayMs - 1.0);
  EXPECT_LE(t["ttft_ms"].get<double>(), t["e2e_ms"].get<double>());
  EXPECT_DOUBLE_EQ(t["e2e_ms"].get<double>(), end);
}

TEST_F(ProxyTimeline, NonStreamingBodyCarriesTheAlignedTimeline) {
  const std::string client_trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  const http::ClientResponse response =
      call("POST", "/v1/completions", R"({"id": "cmpl-plain", "prompt": "hi"})",
           {{"traceparent", client_trace},
            {"X-Pdserve-Timeline", "1"},
            {"Authorization", "Bearer cluster-secret"}});
  ASSERT_EQ(response.status, 200) << response.body;
  expect_aligned(Json::parse(response.body)["usage"]["pdserve_timeline"],
                 "4bf92f3577b34da6a3ce929d0e0e4736");

  const http::HeaderList sent = decode_.last_headers();
  EXPECT_EQ(http::find_header(sent, "X-Pdserve-Timeline").value_or(""), "1");
  const std::optional<http::TraceParent> forwarded =
      http::parse_traceparent(http::find_header(sent, "traceparent").value_or(""));
  ASSERT_TRUE(forwarded.has_value());
  EXPECT_EQ(forwarded->trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_NE(forwarded->parent_id, "00f067aa0ba902b7");  // the proxy's own span

  const auto events = trace_of("cmpl-plain");
  for (const char* name : {"E2E", "TTFT", "proxy.request", "proxy.route", "decode.request"}) {
    EXPECT_TRUE(events.contains(name)) << name;
  }
  EXPECT_EQ(events.at("decode.request")["args"]["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
}

TEST_F(ProxyTimeline, TimelineIsOptInAndRedactedWithoutTheClusterToken) {
  // Not asked: no timeline in the answer, but the proxy still records it.
  const http::ClientResponse plain =
      call("POST", "/v1/completions", R"({"id": "cmpl-quiet", "prompt": "hi"})");
  ASSERT_EQ(plain.status, 200) << plain.body;
  const Json body = Json::parse(plain.body);
  EXPECT_FALSE(body["usage"].contains("pdserve_timeline")) << plain.body;
  EXPECT_EQ(body["usage"]["prompt_tokens"], 3);
  EXPECT_TRUE(trace_of("cmpl-quiet").contains("decode.request"));

  // Asked without the token: the figures, but no node address or id.
  const http::ClientResponse asked =
      call("POST", "/v1/completions", R"({"id": "cmpl-asked", "prompt": "hi"})",
           {{"X-Pdserve-Timeline", "1"}});
  ASSERT_EQ(asked.status, 200) << asked.body;
  const Json timeline = Json::parse(asked.body)["usage"]["pdserve_timeline"];
  EXPECT_EQ(asked.body.find("127.0.0.1"), std::string::npos) << asked.body;
  EXPECT_EQ(asked.body.find("\"decode\":\"decode-"), std::string::npos) << asked.body;
  bool saw_decode_span = false;
  for (const Json& span : timeline["spans"]) {
    if (span["name"] == "decode.request") {
      saw_decode_span = true;
      EXPECT_EQ(span["node"], "decode");
    }
  }
  EXPECT_TRUE(saw_decode_span) << timeline.dump(2);
  EXPECT_GE(timeline["ttft_ms"].get<double>(), kHeadDelayMs - 1.0);
}

TEST_F(ProxyTimeline, StreamWithoutUsageHidesTheComment) {
  const http::ClientResponse response =
      call("POST", "/v1/completions", R"({"id": "cmpl-s", "prompt": "hi", "stream": true})",
           {{"traceparent", "not-a-traceparent"}});
  ASSERT_EQ(response.status, 200);
  EXPECT_EQ(response.body,
            "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\n"
            "data: [DONE]\n\n");
  // An invalid client traceparent: a fresh trace id, forwarded and recorded.
  const std::optional<http::TraceParent> forwarded = http::parse_traceparent(
      http::find_header(decode_.last_headers(), "traceparent").value_or(""));
  ASSERT_TRUE(forwarded.has_value());
  const auto events = trace_of("cmpl-s");
  ASSERT_TRUE(events.contains("E2E"));
  EXPECT_EQ(events.at("E2E")["args"]["trace_id"], forwarded->trace_id);
}

TEST_F(ProxyTimeline, StreamWithUsageGetsTheAlignedTimeline) {
  const http::ClientResponse response =
      call("POST", "/v1/completions",
           R"({"id": "cmpl-u", "prompt": "hi", "stream": true, "include_usage": true})",
           {{"X-Pdserve-Timeline", "1"}, {"Authorization", "Bearer cluster-secret"}});
  ASSERT_EQ(response.status, 200);
  EXPECT_EQ(response.body.find(": pdserve_timeline"), std::string::npos);
  ASSERT_TRUE(response.body.ends_with("data: [DONE]\n\n"));
  const size_t usage_at = response.body.rfind("data: {", response.body.size() - 16);
  const Json chunk = Json::parse(
      response.body.substr(usage_at + 6, response.body.find("\n\n", usage_at) - usage_at - 6));
  const Json& timeline = chunk["usage"]["pdserve_timeline"];
  const std::optional<http::TraceParent> forwarded = http::parse_traceparent(
      http::find_header(decode_.last_headers(), "traceparent").value_or(""));
  ASSERT_TRUE(forwarded.has_value());
  expect_aligned(timeline, forwarded->trace_id);
  EXPECT_EQ(chunk["usage"]["prompt_tokens"], 3);

  // The advisor got the finished request.
  const Advice advice = proxy_->advisor().advise({}, std::chrono::steady_clock::now());
  EXPECT_EQ(advice.requests, 1);
  EXPECT_EQ(advice.failed, 0);
  EXPECT_DOUBLE_EQ(advice.mean_output_tokens, 2.0);

  // The histograms of the split saw it.
  const std::string metrics = call("GET", "/metrics").body;
  for (const char* name : {"pdserve:proxy_time_to_first_token_seconds_count 1",
                           "pdserve:proxy_time_per_output_token_seconds_count 1",
                           "pdserve:proxy_inter_token_latency_seconds_count 1",
                           "pdserve:proxy_decode_queue_time_seconds_count 1"}) {
    EXPECT_NE(metrics.find(name), std::string::npos) << name << "\n" << metrics;
  }
}

TEST_F(ProxyTimeline, TraceEndpointErrors) {
  // Every user's request ids and timings: the cluster token only.
  const http::ClientResponse refused = call("GET", "/trace");
  EXPECT_EQ(refused.status, 401);
  EXPECT_EQ(Json::parse(refused.body)["error"]["code"], "invalid_cluster_token");
  EXPECT_EQ(call("GET", "/trace", "", {{"Authorization", "Bearer wrong"}}).status, 401);
  EXPECT_EQ(call("GET", "/trace?request_id=nope", "", kWithToken).status, 404);
  EXPECT_EQ(call("GET", "/trace?last=0", "", kWithToken).status, 400);
  EXPECT_EQ(call("GET", "/trace?last=1001", "", kWithToken).status, 400);
  const http::ClientResponse empty = call("GET", "/trace", "", kWithToken);
  EXPECT_EQ(empty.status, 200);
  EXPECT_EQ(Json::parse(empty.body)["traceEvents"], Json::array());
}

}  // namespace
}  // namespace pdserve::proxy
