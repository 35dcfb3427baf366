// The timeline message (common/protocol/request_timeline.h): what to_json() writes parse()
// reads back unchanged, through the wire text; each malformed field is refused with its path.
#include "common/protocol/request_timeline.h"

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace pdserve {
namespace {

using Json = nlohmann::json;

// A remotely prefilled request as a decode node reports it: every kind of field and argument.
RequestTimeline decode_timeline() {
  RequestTimeline timeline;
  timeline.request_id = "cmpl-1";
  timeline.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
  timeline.origin = TimelineOrigin::kDecode;
  timeline.head_sent_ms = 40.25;
  timeline.spans = {
      {"decode.request", "decode http://127.0.0.1:8200", 0.0, 90.5, {{"index", int64_t{0}}}},
      {"prefill.remote",
       "decode http://127.0.0.1:8200",
       0.5,
       38.0,
       {{"index", int64_t{0}}, {"prefill_url", std::string("http://127.0.0.1:8100")}}},
      {"kv.transfer",
       "prefill http://127.0.0.1:8100",
       30.0,
       45.0,
       {{"bytes", int64_t{4096}}, {"gb_per_s", 0.125}}},
  };
  timeline.tokens_ms = {40.0, 60.5, 90.5};
  timeline.output_tokens = 3;
  timeline.ttft_ms = 40.0;
  timeline.tpot_ms = 25.25;
  timeline.e2e_ms = 90.5;
  timeline.kv_transfer = KvTransferSummary{4096, 2, 15.0, std::nullopt, 7.5, 28, 28};
  timeline.spec_decode = SpecDecodeSummary{2, 8, 6};
  return timeline;
}

// The proxy's version: no sync, no transfer, one token (no TPOT).
RequestTimeline proxy_timeline() {
  RequestTimeline timeline = decode_timeline();
  timeline.origin = TimelineOrigin::kProxy;
  timeline.head_sent_ms.reset();
  timeline.kv_transfer.reset();
  timeline.spec_decode.reset();
  timeline.tokens_ms = {41.0};
  timeline.output_tokens = 1;
  timeline.tpot_ms.reset();
  return timeline;
}

// As the reader gets it: through the text on the wire.
Result<RequestTimeline> through_the_wire(const RequestTimeline& timeline) {
  return RequestTimeline::parse(Json::parse(timeline.to_json().dump()));
}

TEST(RequestTimelineMessage, RoundTripsThroughTheWire) {
  for (const RequestTimeline& timeline : {decode_timeline(), proxy_timeline()}) {
    Result<RequestTimeline> read = through_the_wire(timeline);
    ASSERT_TRUE(read.ok()) << read.status().to_string() << "\n" << timeline.to_json().dump(2);
    EXPECT_EQ(*read, timeline) << timeline.to_json().dump(2);
  }
}

TEST(RequestTimelineMessage, WritesTheDocumentedFields) {
  const Json decode = decode_timeline().to_json();
  EXPECT_EQ(decode["version"], 1);
  EXPECT_EQ(decode["origin"], "decode");
  EXPECT_EQ(decode["sync"]["head_sent_ms"], 40.25);
  const Json& args = decode["spans"][2]["args"];
  EXPECT_TRUE(args["bytes"].is_number_integer()) << "counts stay integers";
  EXPECT_TRUE(args["gb_per_s"].is_number_float());
  EXPECT_TRUE(decode["kv_transfer"]["gb_per_s"].is_null());
  EXPECT_EQ(decode["kv_transfer"]["exposed_ms"], 7.5);
  EXPECT_EQ(decode["spec_decode"]["accepted_tokens"], 6);
  EXPECT_EQ(decode["spec_decode"]["acceptance_rate"], 0.75);

  const Json proxy = proxy_timeline().to_json();
  EXPECT_EQ(proxy["origin"], "proxy");
  EXPECT_FALSE(proxy.contains("sync"));
  EXPECT_FALSE(proxy.contains("kv_transfer"));
  EXPECT_FALSE(proxy.contains("spec_decode"));
  EXPECT_TRUE(proxy["tpot_ms"].is_null()) << "written as null, not left out";
}

TEST(RequestTimelineMessage, UnknownFieldsAndNullOptionalsAreAccepted) {
  Json json = proxy_timeline().to_json();
  json["added_by_a_later_version"] = {{"anything", Json::array()}};
  json["ttft_ms"] = nullptr;
  json.erase("tpot_ms");
  json["spans"][0].erase("args");
  Result<RequestTimeline> read = RequestTimeline::parse(json);
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  EXPECT_FALSE(read->ttft_ms.has_value());
  EXPECT_FALSE(read->tpot_ms.has_value());
  EXPECT_TRUE(read->spans[0].args.empty());
}

constexpr uint64_t kHuge = std::numeric_limits<uint64_t>::max();

// A decode node's timeline with one field changed, and what the error must say.
struct Malformed {
  std::function<void(Json&)> change;
  std::string error;
};

TEST(RequestTimelineMessage, EachMalformedFieldIsNamed) {
  Json deep = Json::array();
  for (int level = 0; level < 200; ++level) deep = Json::array({deep});
  const std::vector<Malformed> cases = {
      {[](Json& t) { t["version"] = 2; }, "timeline.version is not 1"},
      {[](Json& t) { t["version"] = "1"; }, "timeline.version is not 1"},
      {[](Json& t) { t.erase("request_id"); }, "timeline.request_id is missing"},
      {[](Json& t) { t["request_id"] = 7; }, "timeline.request_id must be a string"},
      {[](Json& t) { t["request_id"] = ""; }, "timeline.request_id is empty"},
      {[](Json& t) { t.erase("trace_id"); }, "timeline.trace_id is missing"},
      {[](Json& t) { t["origin"] = "client"; }, "timeline.origin is neither"},
      {[](Json& t) { t.erase("sync"); }, "timeline.sync is missing"},
      {[](Json& t) { t["sync"] = 40.25; }, "timeline.sync is not an object"},
      {[](Json& t) { t["sync"]["head_sent_ms"] = -1.0; }, "timeline.sync.head_sent_ms is negative"},
      {[](Json& t) { t["sync"]["head_sent_ms"] = "40"; },
       "timeline.sync.head_sent_ms must be a number"},
      {[](Json& t) { t["spans"] = Json::object(); }, "timeline.spans must be an array"},
      {[](Json& t) { t["spans"][1] = "decode.request"; }, "timeline.spans[1] is not an object"},
      {[](Json& t) { t["spans"][1].erase("name"); }, "timeline.spans[1].name is missing"},
      {[](Json& t) { t["spans"][1]["node"] = Json::array(); },
       "timeline.spans[1].node must be a string"},
      {[](Json& t) { t["spans"][1]["start_ms"] = std::numeric_limits<double>::infinity(); },
       "timeline.spans[1].start_ms must be finite"},
      {[](Json& t) { t["spans"][1]["end_ms"] = 0.25; },
       "timeline.spans[1] (prefill.remote) ends before it starts"},
      {[](Json& t) { t["spans"][1]["args"] = Json::array(); },
       "timeline.spans[1].args must be an object"},
      {[](Json& t) { t["spans"][1]["args"]["index"] = true; },
       "timeline.spans[1].args.index must be a finite number or a string"},
      {[&](Json& t) { t["spans"][1]["args"]["nested"] = deep; },
       "timeline.spans[1].args.nested must be a finite number or a string"},
      {[](Json& t) { t["spans"][2]["args"]["bytes"] = kHuge; },
       "timeline.spans[2].args.bytes is out of range"},
      {[](Json& t) { t.erase("tokens_ms"); }, "timeline.tokens_ms is missing"},
      {[](Json& t) { t["tokens_ms"][1] = "60.5"; }, "timeline.tokens_ms must hold finite numbers"},
      {[](Json& t) { t["output_tokens"] = -1; },
       "timeline.output_tokens must be a non-negative integer"},
      {[](Json& t) { t["output_tokens"] = 2.5; },
       "timeline.output_tokens must be a non-negative integer"},
      {[](Json& t) { t["ttft_ms"] = "fast"; }, "timeline.ttft_ms must be a number"},
      {[](Json& t) { t.erase("e2e_ms"); }, "timeline.e2e_ms is missing"},
      {[](Json& t) { t["kv_transfer"] = Json::array(); }, "timeline.kv_transfer is not an object"},
      {[](Json& t) { t["kv_transfer"]["bytes"] = -4096; },
       "timeline.kv_transfer.bytes must be a non-negative integer"},
      {[](Json& t) { t["kv_transfer"]["blocks"] = kHuge; },
       "timeline.kv_transfer.blocks must be a non-negative integer in range"},
      {[](Json& t) { t["kv_transfer"].erase("layers"); }, "timeline.kv_transfer.layers is missing"},
      {[](Json& t) { t["kv_transfer"]["gb_per_s"] = "fast"; },
       "timeline.kv_transfer.gb_per_s must be a number"},
  };
  for (const Malformed& malformed : cases) {
    Json json = decode_timeline().to_json();
    malformed.change(json);
    const Result<RequestTimeline> read = RequestTimeline::parse(json);
    ASSERT_FALSE(read.ok()) << malformed.error;
    EXPECT_EQ(read.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(read.status().message().find(malformed.error), std::string::npos)
        << "expected '" << malformed.error << "' in '" << read.status().message() << "'";
  }
  for (const Json& not_a_timeline : {Json::array(), Json("timeline"), Json(nullptr)}) {
    const Result<RequestTimeline> read = RequestTimeline::parse(not_a_timeline);
    ASSERT_FALSE(read.ok());
    EXPECT_EQ(read.status().message(), "timeline is not an object");
  }
}

}  // namespace
}  // namespace pdserve
