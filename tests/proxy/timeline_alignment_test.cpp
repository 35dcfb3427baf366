// Clock alignment arithmetic, the spans the proxy adds, the client-visible TTFT/TPOT/E2E, the
// PD-split summary, and traceparent validation and generation.
#include "proxy/tracing/timeline_alignment.h"

#include <gtest/gtest.h>

#include "proxy/tracing/timeline_metrics.h"

namespace pdserve::proxy {
namespace {

using Json = nlohmann::json;

// A decode node that answered 12 ms after its arrival (head_sent_ms = 12), three tokens.
Json node_timeline() {
  return {{"version", 1},
          {"request_id", "cmpl-1"},
          {"trace_id", "4bf92f3577b34da6a3ce929d0e0e4736"},
          {"origin", "decode"},
          {"sync", {{"head_sent_ms", 12.0}}},
          {"spans",
           {{{"name", "decode.request"},
             {"node", "decode http://d"},
             {"start_ms", 0.0},
             {"end_ms", 100.0},
             {"args", {{"index", 0}}}},
            {{"name", "prefill.queue"},
             {"node", "prefill http://p"},
             {"start_ms", 5.0},
             {"end_ms", 9.0}},
            {{"name", "prefill.chunk"},
             {"node", "prefill http://p"},
             {"start_ms", 9.0},
             {"end_ms", 20.0},
             {"args", {{"prompt_tokens", 64}}}},
            {{"name", "prefill.chunk"},
             {"node", "prefill http://p"},
             {"start_ms", 21.0},
             {"end_ms", 30.0},
             {"args", {{"prompt_tokens", 16}}}},
            {{"name", "decode.queue"},
             {"node", "decode http://d"},
             {"start_ms", 40.0},
             {"end_ms", 43.0}}}},
          {"tokens_ms", {30.0, 60.0, 100.0}},
          {"output_tokens", 3},
          {"ttft_ms", 30.0},
          {"tpot_ms", 35.0},
          {"e2e_ms", 100.0},
          {"kv_transfer",
           {{"bytes", 1024},
            {"blocks", 1},
            {"ms", 7.5},
            {"gb_per_s", nullptr},
            {"exposed_ms", nullptr},
            {"layers", 2},
            {"layers_overlapped", 2}}}};
}

ProxyMeasurements measured() {
  ProxyMeasurements proxy;
  proxy.trace_id = "0af7651916cd43dd8448eb211c80319c";
  // Routed at 0, refused, routed again at 3 and sent at 4; the head came at 20.
  proxy.routes = {{0.0, 1.0, "decode-1", "prefill-1", "remote"}, {3.0, 4.0, "decode-2", "", "local"}};
  proxy.head_ms = 20.0;
  proxy.end_ms = 120.0;
  return proxy;
}

// The node's timeline as the proxy reads it, aligned.
Result<RequestTimeline> read_and_align(const Json& node, const ProxyMeasurements& proxy) {
  PDS_ASSIGN_OR_RETURN(const RequestTimeline parsed, RequestTimeline::parse(node));
  return align_timeline(parsed, proxy);
}

// The same in the form the client gets.
Result<Json> aligned_json(const Json& node, const ProxyMeasurements& proxy) {
  PDS_ASSIGN_OR_RETURN(const RequestTimeline aligned, read_and_align(node, proxy));
  return Json(aligned.to_json());
}

const Json* span_named(const Json& timeline, std::string_view name) {
  for (const Json& span : timeline["spans"]) {
    if (span["name"] == name) return &span;
  }
  return nullptr;
}

// The head crossed slowly and the end quickly: the symmetric estimate (arrival at 4 + 16 / 2 =
// 12) would end the node's 100 ms after the proxy's last byte at 105; the node's arrival is
// pulled back to 105 - 100 = 5, so every node span stays inside the proxy's exchange.
TEST(ClockOffset, TheNodesEndNeverFollowsTheProxysEnd) {
  Json node = node_timeline();
  node["sync"]["head_sent_ms"] = 0.0;
  ProxyMeasurements proxy = measured();
  proxy.end_ms = 105.0;
  Result<Json> aligned = aligned_json(node, proxy);
  ASSERT_TRUE(aligned.ok()) << aligned.status().to_string();
  const Json* request = span_named(*aligned, "decode.request");
  ASSERT_NE(request, nullptr);
  EXPECT_DOUBLE_EQ((*request)["start_ms"].get<double>(), 5.0);
  EXPECT_DOUBLE_EQ((*request)["end_ms"].get<double>(), 105.0);
  EXPECT_DOUBLE_EQ((*aligned)["tokens_ms"][0].get<double>(), 35.0);
  EXPECT_DOUBLE_EQ((*aligned)["ttft_ms"].get<double>(), 35.0 + 1.0) << "one way: 5 - 4";
}

TEST(ClockOffset, SymmetricDelaysSplitTheNetworkTime) {
  // Sent at 4, head at 20, the node took 12 of those 16 ms: 2 ms each way.
  const ClockOffset offset = estimate_offset(4.0, 20.0, 12.0);
  EXPECT_DOUBLE_EQ(offset.one_way_ms, 2.0);
  EXPECT_DOUBLE_EQ(offset.node_arrival_ms, 6.0);
  // A node claiming more time than the round trip had: no network delay, not a negative one.
  const ClockOffset skewed = estimate_offset(4.0, 20.0, 30.0);
  EXPECT_DOUBLE_EQ(skewed.one_way_ms, 0.0);
  EXPECT_DOUBLE_EQ(skewed.node_arrival_ms, 4.0);
}

TEST(AlignTimeline, ShiftsNodeTimesAndAddsTheProxySpans) {
  Result<Json> aligned = aligned_json(node_timeline(), measured());
  ASSERT_TRUE(aligned.ok()) << aligned.status().to_string();
  const Json& t = *aligned;
  EXPECT_EQ(t["origin"], "proxy");
  EXPECT_FALSE(t.contains("sync"));
  EXPECT_EQ(t["trace_id"], "0af7651916cd43dd8448eb211c80319c");
  EXPECT_EQ(t["request_id"], "cmpl-1");

  const Json* decode = span_named(t, "decode.request");
  ASSERT_NE(decode, nullptr);
  EXPECT_DOUBLE_EQ((*decode)["start_ms"].get<double>(), 6.0);
  EXPECT_DOUBLE_EQ((*decode)["end_ms"].get<double>(), 106.0);
  EXPECT_EQ((*decode)["args"]["index"], 0);
  EXPECT_EQ(t["tokens_ms"], Json({36.0, 66.0, 106.0}));

  const Json* request = span_named(t, "proxy.request");
  ASSERT_NE(request, nullptr);
  EXPECT_EQ((*request)["node"], "proxy");
  EXPECT_DOUBLE_EQ((*request)["start_ms"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ((*request)["end_ms"].get<double>(), 120.0);
  EXPECT_EQ((*request)["args"]["attempts"], 2);
  std::vector<Json> routes;
  for (const Json& span : t["spans"]) {
    if (span["name"] != "proxy.route") continue;
    routes.push_back(span["args"]);
    EXPECT_LE(span["start_ms"].get<double>(), span["end_ms"].get<double>());
  }
  ASSERT_EQ(routes.size(), 2u);
  // Where each try's prompt was to be prefilled.
  EXPECT_EQ(routes[0], (Json{{"decode", "decode-1"}, {"prefill", "prefill-1"}, {"placement", "remote"}}));
  EXPECT_EQ(routes[1], (Json{{"decode", "decode-2"}, {"placement", "local"}}));

  // Client-visible: the first token left at 36 and took 2 ms more to the proxy.
  EXPECT_DOUBLE_EQ(t["ttft_ms"].get<double>(), 38.0);
  EXPECT_DOUBLE_EQ(t["e2e_ms"].get<double>(), 120.0);
  EXPECT_DOUBLE_EQ(t["tpot_ms"].get<double>(), (120.0 - 38.0) / 2.0);
}

TEST(AlignTimeline, OneTokenHasNoTpot) {
  Json timeline = node_timeline();
  timeline["tokens_ms"] = {30.0};
  timeline["output_tokens"] = 1;
  Result<Json> aligned = aligned_json(timeline, measured());
  ASSERT_TRUE(aligned.ok());
  EXPECT_TRUE((*aligned)["tpot_ms"].is_null());
}

TEST(AlignTimeline, OnlyADecodeNodesTimelineIsAligned) {
  Result<RequestTimeline> aligned = read_and_align(node_timeline(), measured());
  ASSERT_TRUE(aligned.ok()) << aligned.status().to_string();
  // Aligning the proxy's own timeline would shift it twice.
  const Result<RequestTimeline> twice = align_timeline(*aligned, measured());
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("origin"), std::string::npos);
  ProxyMeasurements never_sent = measured();
  never_sent.routes.clear();
  EXPECT_FALSE(read_and_align(node_timeline(), never_sent).ok());
}

TEST(AlignTimeline, MalformedTimelinesNameTheField) {
  const auto error_of = [](Json timeline) {
    Result<Json> aligned = aligned_json(timeline, measured());
    EXPECT_FALSE(aligned.ok());
    EXPECT_EQ(aligned.status().code(), StatusCode::kInvalidArgument);
    return aligned.status().message();
  };
  Json no_sync = node_timeline();
  no_sync.erase("sync");
  EXPECT_NE(error_of(no_sync).find("sync"), std::string::npos);
  Json bad_span = node_timeline();
  bad_span["spans"][1]["end_ms"] = 1.0;
  EXPECT_NE(error_of(bad_span).find("spans[1] (prefill.queue) ends before"), std::string::npos);
  Json bad_start = node_timeline();
  bad_start["spans"][2]["start_ms"] = "9";
  EXPECT_NE(error_of(bad_start).find("spans[2].start_ms"), std::string::npos);
  Json bad_version = node_timeline();
  bad_version["version"] = 2;
  EXPECT_NE(error_of(bad_version).find("version"), std::string::npos);
  Json bad_tokens = node_timeline();
  bad_tokens["output_tokens"] = "3";
  EXPECT_NE(error_of(bad_tokens).find("output_tokens"), std::string::npos);
  EXPECT_NE(error_of(Json::array()).find("not an object"), std::string::npos);
}

TEST(TimelineSummary, PhasesOfTheSplit) {
  Result<RequestTimeline> aligned = read_and_align(node_timeline(), measured());
  ASSERT_TRUE(aligned.ok());
  const TimelineSummary summary = summarize_timeline(*aligned);
  EXPECT_DOUBLE_EQ(*summary.ttft_ms, 38.0);
  EXPECT_DOUBLE_EQ(*summary.prefill_queue_ms, 4.0);
  EXPECT_DOUBLE_EQ(*summary.prefill_compute_ms, 21.0);  // 9 -> 30 across two chunks
  EXPECT_DOUBLE_EQ(*summary.decode_queue_ms, 3.0);
  EXPECT_DOUBLE_EQ(*summary.kv_transfer_ms, 7.5);
  EXPECT_EQ(summary.prompt_tokens_computed, 80);
  EXPECT_EQ(summary.inter_token_ms, (std::vector<double>{30.0, 40.0}));
  const FinishedRequest finished = finished_request(summary);
  EXPECT_DOUBLE_EQ(finished.e2e_ms, 120.0);
  EXPECT_EQ(finished.output_tokens, 3);
  EXPECT_TRUE(finished.ok);

  // A colocated request: no prefill node, no transfer.
  Json local = node_timeline();
  local.erase("kv_transfer");
  local["spans"] = Json::array({node_timeline()["spans"][0]});
  Result<RequestTimeline> local_aligned = read_and_align(local, measured());
  ASSERT_TRUE(local_aligned.ok());
  const TimelineSummary local_summary = summarize_timeline(*local_aligned);
  EXPECT_FALSE(local_summary.kv_transfer_ms.has_value());
  EXPECT_FALSE(local_summary.prefill_queue_ms.has_value());
}

}  // namespace
}  // namespace pdserve::proxy
