// OTLP span trees from a known aligned timeline (ids, parents, unix times, attributes, the
// ExportTraceServiceRequest shape), the endpoint URL rules, and an exporter that never holds a
// request up when its collector is gone. The JSON's conformance to opentelemetry-proto is
// checked by tests/conformance/otlp_traces_test.py (json_format.Parse).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <set>
#include <stdexcept>

#include "proxy/tracing/otlp_exporter.h"
#include "proxy/tracing/otlp_trace.h"

namespace pdserve::proxy {
namespace {

using Json = nlohmann::json;

constexpr const char* kTraceId = "4bf92f3577b34da6a3ce929d0e0e4736";
constexpr int64_t kArrivalNs = 1'700'000'000'000'000'000;

// A remotely prefilled request as align_timeline() leaves it (ms after the proxy's arrival).
RequestTimeline aligned_timeline() {
  RequestTimeline timeline;
  timeline.request_id = "cmpl-7";
  timeline.trace_id = kTraceId;
  timeline.origin = TimelineOrigin::kProxy;
  timeline.spans = {
      {"proxy.request", "proxy", 0.0, 300.0, {{"attempts", int64_t{1}}}},
      {"proxy.route", "proxy", 0.0, 0.5, {{"decode", std::string("d1")}}},
      {"decode.request", "decode http://d", 1.0, 299.0, {{"index", int64_t{0}}}},
      {"prefill.remote", "decode http://d", 1.5, 40.0, {}},
      {"prefill.request", "prefill http://p", 2.0, 41.0, {}},
      {"prefill.queue", "prefill http://p", 2.5, 3.0, {}},
      {"prefill.chunk", "prefill http://p", 3.0, 38.0, {{"prompt_tokens", int64_t{80}}}},
      {"kv.transfer", "prefill http://p", 37.0, 40.5, {{"bytes", int64_t{4096}}}},
      {"decode.kv_wait", "decode http://d", 40.0, 41.5, {}},
      {"decode.queue", "decode http://d", 41.5, 42.0, {}},
      {"decode.steps", "decode http://d", 42.0, 298.0, {{"tokens", int64_t{8}}}},
  };
  timeline.output_tokens = 8;
  timeline.ttft_ms = 40.25;
  timeline.e2e_ms = 300.0;
  return timeline;
}

OtlpRequestInfo info() {
  OtlpRequestInfo info;
  info.root_span_id = "00f067aa0ba902b7";
  info.client_span_id = "b7ad6b7169203331";
  info.arrival_unix_ns = kArrivalNs;
  info.prompt_tokens = 96;
  info.completion_tokens = 8;
  return info;
}

std::function<std::string()> counting_ids() {
  auto next = std::make_shared<int>(0);
  return [next] {
    char id[17];
    std::snprintf(id, sizeof id, "%016x", ++*next);
    return std::string(id);
  };
}

const Json* find_attribute(const Json& span, std::string_view key) {
  for (const Json& attribute : span["attributes"]) {
    if (attribute["key"] == key) return &attribute["value"];
  }
  return nullptr;
}

const Json& span_named(const std::vector<Json>& spans, std::string_view name) {
  for (const Json& span : spans) {
    if (span["name"] == name) return span;
  }
  throw std::runtime_error("no span " + std::string(name));
}

TEST(OtlpSpans, RootIsTheProxysSpanUnderTheClientsWithTheRequestAttributes) {
  const std::vector<Json> spans = otlp_request_spans(aligned_timeline(), info(), counting_ids());
  ASSERT_EQ(spans.size(), 11u);
  const Json& root = spans.front();
  EXPECT_EQ(root["name"], "proxy.request");
  EXPECT_EQ(root["traceId"], kTraceId);
  EXPECT_EQ(root["spanId"], "00f067aa0ba902b7");
  EXPECT_EQ(root["parentSpanId"], "b7ad6b7169203331");
  EXPECT_EQ(root["kind"], 2);  // SPAN_KIND_SERVER
  EXPECT_EQ(root["startTimeUnixNano"], std::to_string(kArrivalNs));
  EXPECT_EQ(root["endTimeUnixNano"], std::to_string(kArrivalNs + 300'000'000));
  EXPECT_EQ(*find_attribute(root, "gen_ai.request.id"), Json({{"stringValue", "cmpl-7"}}));
  EXPECT_EQ(*find_attribute(root, "gen_ai.usage.prompt_tokens"), Json({{"intValue", "96"}}));
  EXPECT_EQ(*find_attribute(root, "gen_ai.usage.completion_tokens"), Json({{"intValue", "8"}}));
  EXPECT_DOUBLE_EQ((*find_attribute(root, "gen_ai.latency.time_to_first_token"))["doubleValue"],
                   0.04025);
  EXPECT_DOUBLE_EQ((*find_attribute(root, "gen_ai.latency.e2e"))["doubleValue"], 0.3);
  EXPECT_DOUBLE_EQ((*find_attribute(root, "gen_ai.latency.time_in_queue"))["doubleValue"], 0.001);
  EXPECT_DOUBLE_EQ((*find_attribute(root, "gen_ai.latency.time_in_model_prefill"))["doubleValue"],
                   0.035);
  EXPECT_EQ(*find_attribute(root, "pdserve.attempts"), Json({{"intValue", "1"}}));
}

TEST(OtlpSpans, ChildrenHangUnderTheSpanThatContainsThem) {
  const std::vector<Json> spans = otlp_request_spans(aligned_timeline(), info(), counting_ids());
  const auto id_of = [&](std::string_view name) { return span_named(spans, name)["spanId"]; };
  const auto parent_of = [&](std::string_view name) {
    return span_named(spans, name)["parentSpanId"];
  };
  EXPECT_EQ(parent_of("proxy.route"), "00f067aa0ba902b7");
  EXPECT_EQ(parent_of("decode.request"), "00f067aa0ba902b7");
  for (const char* name :
       {"prefill.remote", "prefill.request", "decode.kv_wait", "decode.queue", "decode.steps"}) {
    EXPECT_EQ(parent_of(name), id_of("decode.request")) << name;
  }
  for (const char* name : {"prefill.queue", "prefill.chunk", "kv.transfer"}) {
    EXPECT_EQ(parent_of(name), id_of("prefill.request")) << name;
  }
  std::set<std::string> ids;
  for (const Json& span : spans) {
    EXPECT_EQ(span["traceId"], kTraceId);
    ids.insert(span["spanId"].get<std::string>());
    if (span["name"] != "proxy.request") {
      EXPECT_EQ(span["kind"], 1);  // SPAN_KIND_INTERNAL
    }
  }
  EXPECT_EQ(ids.size(), spans.size());
  const Json& chunk = span_named(spans, "prefill.chunk");
  EXPECT_EQ(chunk["startTimeUnixNano"], std::to_string(kArrivalNs + 3'000'000));
  EXPECT_EQ(chunk["endTimeUnixNano"], std::to_string(kArrivalNs + 38'000'000));
  EXPECT_EQ(*find_attribute(chunk, "pdserve.prompt_tokens"), Json({{"intValue", "80"}}));
  EXPECT_EQ(*find_attribute(chunk, "pdserve.node"), Json({{"stringValue", "prefill http://p"}}));
}

TEST(OtlpSpans, WithoutAClientSpanOrPrefillNodeTheTreeStillCloses) {
  RequestTimeline timeline = aligned_timeline();
  std::erase_if(timeline.spans, [](const RequestTimelineSpan& span) {
    return span.name == "prefill.request" || span.name == "prefill.remote" ||
           span.name == "kv.transfer";
  });
  OtlpRequestInfo request = info();
  request.client_span_id.clear();
  request.prompt_tokens.reset();
  const std::vector<Json> spans = otlp_request_spans(timeline, request, counting_ids());
  EXPECT_FALSE(spans.front().contains("parentSpanId"));
  EXPECT_EQ(find_attribute(spans.front(), "gen_ai.usage.prompt_tokens"), nullptr);
  // Prefilled on the decode node: the engine spans hang under decode.request.
  EXPECT_EQ(span_named(spans, "prefill.chunk")["parentSpanId"],
            span_named(spans, "decode.request")["spanId"]);
}

TEST(OtlpSpans, ExportRequestHasTheResourceAndScope) {
  const Json body = otlp_export_request(
      "pdserve-proxy", otlp_request_spans(aligned_timeline(), info(), counting_ids()));
  const Json& resource_spans = body["resourceSpans"];
  ASSERT_EQ(resource_spans.size(), 1u);
  EXPECT_EQ(resource_spans[0]["resource"]["attributes"],
            Json::parse(R"([{"key": "service.name", "value": {"stringValue": "pdserve-proxy"}}])"));
  const Json& scope_spans = resource_spans[0]["scopeSpans"];
  ASSERT_EQ(scope_spans.size(), 1u);
  EXPECT_EQ(scope_spans[0]["scope"]["name"], "pdserve.proxy");
  EXPECT_EQ(scope_spans[0]["spans"].size(), 11u);
}

TEST(OtlpEndpoint, ABaseUrlGetsTheTracesPath) {
  Result<OtlpEndpoint> bare = parse_otlp_traces_endpoint("http://collector:4318");
  ASSERT_TRUE(bare.ok()) << bare.status().message();
  EXPECT_EQ(bare->base, (http::BaseUrl{"collector", "4318"}));
  EXPECT_EQ(bare->path, "/v1/traces");
  EXPECT_EQ(parse_otlp_traces_endpoint("http://collector:4318/")->path, "/v1/traces");
  EXPECT_EQ(parse_otlp_traces_endpoint("http://collector:4318/v1/traces")->path, "/v1/traces");
  EXPECT_EQ(parse_otlp_traces_endpoint("http://c/otel/traces")->path, "/otel/traces");
  EXPECT_EQ(parse_otlp_traces_endpoint("http://c/otel/traces")->base.port, "80");
  EXPECT_FALSE(parse_otlp_traces_endpoint("https://collector:4318").ok());
  EXPECT_FALSE(parse_otlp_traces_endpoint("collector:4318").ok());
  EXPECT_FALSE(parse_otlp_traces_endpoint("http://:4318/v1/traces").ok());
}

double counter_value(const metrics::Registry& registry, const std::string& name) {
  const std::string text = registry.render();
  const size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + name.size() + 2));
}

TEST(OtlpExporter, ADeadCollectorDropsSpansAndNeverHoldsARequest) {
  metrics::Registry registry;
  OtlpExporterOptions options;
  options.endpoint = *parse_otlp_traces_endpoint("http://127.0.0.1:1");  // nothing listens
  options.batch_delay = std::chrono::milliseconds(10);
  options.max_queue_spans = 11;  // one request
  {
    Result<std::unique_ptr<OtlpExporter>> exporter = OtlpExporter::create(options, registry);
    ASSERT_TRUE(exporter.ok());
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) (*exporter)->enqueue(aligned_timeline(), info());
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
  }  // joins, after flushing what waits
  EXPECT_EQ(counter_value(registry, "pdserve:otlp_spans_dropped_total"), 20 * 11);
  EXPECT_EQ(counter_value(registry, "pdserve:otlp_spans_exported_total"), 0);
}

TEST(OtlpExporter, RefusesEmptyLimits) {
  metrics::Registry registry;
  OtlpExporterOptions options;
  options.max_batch_spans = 0;
  EXPECT_FALSE(OtlpExporter::create(options, registry).ok());
}

}  // namespace
}  // namespace pdserve::proxy
