// The OpenAI API server's request timelines: in non-streamed answers, in the usage chunk or as
// an SSE comment of streams, and only when asked.
#include "tests/api/api_server_fixture.h"

namespace pdserve::api_test {
namespace {

// The timeline in a non-streamed answer asked for it: one token time per completion token of
// choice 0, the trace id of the caller's traceparent, a decode.request span per choice ending
// by e2e.
TEST_F(ApiServerTest, NonStreamedAnswerCarriesItsTimeline) {
  start({"a", "b", "c", "d", "e"});
  service_->set_step_delay(5ms);
  TestClient client(server_->port());
  const auto sent = std::chrono::steady_clock::now();
  ASSERT_TRUE(client.send(
      make_request("POST", "/v1/completions", R"({"prompt": "x", "max_tokens": 4, "n": 2})",
                   "X-Pdserve-Timeline: 1\r\n"
                   "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n")));
  auto response = client.read_response();
  const double client_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - sent).count();
  ASSERT_TRUE(response);
  ASSERT_EQ(response->result_int(), 200) << response->body();
  const Json body = Json::parse(response->body());
  const Json& timeline = body["usage"]["pdserve_timeline"];
  ASSERT_TRUE(timeline.is_object()) << body.dump();
  EXPECT_EQ(timeline["version"], 1);
  EXPECT_EQ(timeline["request_id"], body["id"]);
  EXPECT_EQ(timeline["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(timeline["origin"], "decode");
  ASSERT_EQ(timeline["tokens_ms"].size(), 4u);
  EXPECT_EQ(timeline["output_tokens"], 4);
  double previous = 0;
  for (const Json& token : timeline["tokens_ms"]) {
    EXPECT_GE(token.get<double>(), previous);
    previous = token.get<double>();
  }
  const double ttft = timeline["ttft_ms"].get<double>();
  const double e2e = timeline["e2e_ms"].get<double>();
  EXPECT_EQ(ttft, timeline["tokens_ms"][0].get<double>());
  EXPECT_GE(e2e, previous);
  EXPECT_GE(e2e, 3 * 5.0) << "four steps of 5 ms";
  EXPECT_LE(e2e, client_ms);
  EXPECT_NEAR(timeline["tpot_ms"].get<double>(), (e2e - ttft) / 3, 1e-9);
  EXPECT_GE(timeline["sync"]["head_sent_ms"].get<double>(), e2e);
  EXPECT_LE(timeline["sync"]["head_sent_ms"].get<double>(), client_ms);
  EXPECT_FALSE(timeline.contains("kv_transfer"));
  std::set<int> request_spans;
  for (const Json& span : timeline["spans"]) {
    if (span["name"] != "decode.request") continue;
    request_spans.insert(span["args"]["index"].get<int>());
    EXPECT_EQ(span["start_ms"], 0.0);
    EXPECT_LE(span["end_ms"].get<double>(), timeline["sync"]["head_sent_ms"].get<double>());
    EXPECT_EQ(span["node"], "decode http://t") << "named by the Host header the client sent";
  }
  EXPECT_EQ(request_spans, (std::set<int>{0, 1}));
}

// The timeline is opt-in: answers and usage chunks of callers that did not ask have none.
TEST_F(ApiServerTest, TimelineOnlyWhenAsked) {
  start({"a", "b"});
  const Json whole =
      Json::parse(post("/v1/completions", R"({"prompt": "x", "max_tokens": 2})").body());
  EXPECT_EQ(whole["usage"]["completion_tokens"], 2) << whole.dump();
  EXPECT_FALSE(whole["usage"].contains("pdserve_timeline")) << whole.dump();
  const std::string streamed =
      post("/v1/completions", R"({"prompt": "x", "max_tokens": 2, "stream": true,
                                  "stream_options": {"include_usage": true}})")
          .body();
  EXPECT_NE(streamed.find("\"completion_tokens\":2"), std::string::npos) << streamed;
  EXPECT_EQ(streamed.find("pdserve_timeline"), std::string::npos) << streamed;
}

// A stream without a usage chunk: the timeline comes as an SSE comment before [DONE] only when
// the proxy asks for it; with include_usage it is in the usage chunk, and a fresh trace id is
// made when the caller's traceparent is invalid.
TEST_F(ApiServerTest, StreamedTimelineAsCommentOrInUsage) {
  start({"a", "b", "c"});
  const auto stream_body = [&](const std::string& body, const std::string& headers) {
    TestClient client(server_->port());
    EXPECT_TRUE(client.send(make_request("POST", "/v1/completions", body, headers)));
    auto response = client.read_response();
    EXPECT_TRUE(response);
    return response ? response->body() : std::string();
  };
  const std::string plain = R"({"prompt": "x", "max_tokens": 3, "stream": true})";
  EXPECT_EQ(stream_body(plain, "").find("pdserve_timeline"), std::string::npos);

  const std::string with_comment = stream_body(plain, "X-Pdserve-Timeline: 1\r\n");
  const std::string marker = ": pdserve_timeline ";
  const size_t comment = with_comment.find("\n\n" + marker);
  ASSERT_NE(comment, std::string::npos) << with_comment;
  const size_t json_start = comment + 2 + marker.size();
  const size_t json_end = with_comment.find("\n\n", json_start);
  ASSERT_NE(json_end, std::string::npos);
  EXPECT_EQ(with_comment.substr(json_end), "\n\ndata: [DONE]\n\n") << "just before [DONE]";
  const Json timeline = Json::parse(with_comment.substr(json_start, json_end - json_start));
  EXPECT_EQ(timeline["tokens_ms"].size(), 3u);
  EXPECT_EQ(timeline["trace_id"].get<std::string>().size(), 32u);

  const std::string with_usage = stream_body(
      R"({"prompt": "x", "max_tokens": 3, "stream": true,
          "stream_options": {"include_usage": true}})",
      "X-Pdserve-Timeline: 1\r\ntraceparent: 00-zz-00f067aa0ba902b7-01\r\n");
  EXPECT_EQ(with_usage.find(marker), std::string::npos) << "no comment when usage carries it";
  bool done = false;
  const std::vector<Json> events = sse_events(with_usage, done);
  EXPECT_TRUE(done);
  ASSERT_FALSE(events.empty());
  const Json& usage_timeline = events.back()["usage"]["pdserve_timeline"];
  EXPECT_EQ(usage_timeline["output_tokens"], 3);
  EXPECT_EQ(usage_timeline["request_id"], events.back()["id"]);
  const std::string trace = usage_timeline["trace_id"];
  EXPECT_EQ(trace.size(), 32u);
  EXPECT_NE(trace, timeline["trace_id"].get<std::string>());
  // Streamed: the head left before the first token.
  EXPECT_LE(usage_timeline["sync"]["head_sent_ms"].get<double>(),
            usage_timeline["ttft_ms"].get<double>());
}

}  // namespace
}  // namespace pdserve::api_test
