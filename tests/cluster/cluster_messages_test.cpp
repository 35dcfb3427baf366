// The node <-> proxy messages: each serialises to what its parser reads back, and the parser
// refuses what would let a node lie its way to routing or crash the proxy.
#include "common/cluster/cluster_messages.h"

#include <gtest/gtest.h>

namespace pdserve {
namespace {

using Json = nlohmann::json;

TEST(ClusterMessages, EveryMessageRoundTrips) {
  NodeRegistration registration;
  registration.role = NodeRole::kPrefill;
  registration.url = "http://10.0.0.5:8100";
  registration.model = "qwen3-0.6b";
  registration.kv_descriptor = "AAEC";
  registration.kv_blocks_total = 4096;
  registration.tokenizer_sha256 = std::string(64, 'c');
  EXPECT_EQ(NodeRegistration::parse(registration.to_json()).value(), registration);

  NodeLoad load;
  load.num_running = 3;
  load.num_waiting = 1;
  load.kv_blocks_total = 100;
  load.kv_blocks_used = 40;
  load.prompt_tokens_total = int64_t{1} << 40;
  load.generation_tokens_total = 7;
  EXPECT_EQ(Heartbeat::parse(Heartbeat{load, std::nullopt}.to_json()).value().load, load);

  EXPECT_EQ(RegistrationReply::parse(RegistrationReply{"decode-7"}.to_json()).value().id,
            "decode-7");
  for (NodeState state : {NodeState::kUp, NodeState::kDraining}) {
    const HeartbeatReply reply = HeartbeatReply::parse(HeartbeatReply{"p-1", state}.to_json()).value();
    EXPECT_EQ(reply.id, "p-1");
    EXPECT_EQ(reply.state, state);
  }
}

TEST(ClusterMessages, RegistrationNormalisesTheUrlAndDefaultsOptionalFields) {
  const NodeRegistration parsed =
      NodeRegistration::parse(Json{{"role", "decode"}, {"url", "http://127.0.0.1:9000/"}}).value();
  EXPECT_EQ(parsed.url, "http://127.0.0.1:9000");
  EXPECT_EQ(parsed.model, "");
  EXPECT_EQ(parsed.kv_descriptor, "");
  EXPECT_EQ(parsed.kv_blocks_total, 0);
  EXPECT_EQ(parsed.tokenizer_sha256, "");
}

TEST(ClusterMessages, BadRegistrationsAreRefusedNamingTheField) {
  const Json good =
      NodeRegistration{NodeRole::kDecode, "http://h:1", "m", "", 10, std::string(64, 'f')}
          .to_json();
  const auto refused = [&](Json body, const std::string& part) {
    const Result<NodeRegistration> parsed = NodeRegistration::parse(body);
    EXPECT_FALSE(parsed.ok()) << body.dump();
    if (!parsed.ok()) {
      EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(parsed.status().message().find(part), std::string::npos)
          << parsed.status().message();
    }
  };
  refused(Json::array(), "not a JSON object");
  Json no_role = good;
  no_role.erase("role");
  refused(no_role, "'role'");
  Json chef = good;
  chef["role"] = "chef";
  refused(chef, "'role'");
  Json url_number = good;
  url_number["url"] = 80;
  refused(url_number, "'url'");
  Json with_path = good;
  with_path["url"] = "http://h:1/v1";
  refused(with_path, "path");
  Json model_number = good;
  model_number["model"] = 3;
  refused(model_number, "'model'");
  Json negative = good;
  negative["kv_blocks_total"] = -1;
  refused(negative, "'kv_blocks_total'");
  for (const Json& identity : {Json("F" + std::string(63, 'f')), Json(std::string(63, 'f')),
                               Json("sha256:" + std::string(64, 'f')), Json(7)}) {
    Json bad_identity = good;
    bad_identity["tokenizer_sha256"] = identity;
    refused(bad_identity, "'tokenizer_sha256'");
  }
}

TEST(ClusterMessages, ImpossibleLoadsAreRefused) {
  const auto refused = [](const Json& load, const std::string& part) {
    const Result<Heartbeat> parsed = Heartbeat::parse(Json{{"load", load}});
    ASSERT_FALSE(parsed.ok()) << load.dump();
    EXPECT_NE(parsed.status().message().find(part), std::string::npos)
        << parsed.status().message();
  };
  refused({{"kv_blocks_total", 100}, {"kv_blocks_used", -1000}}, "'kv_blocks_used'");
  refused({{"kv_blocks_total", 100}, {"kv_blocks_used", 101}}, "exceeds 'kv_blocks_total'");
  refused({{"num_running", -5}}, "'num_running'");
  refused({{"num_waiting", int64_t{1} << 32}}, "'num_waiting'");
  refused({{"kv_blocks_total", 1.5}}, "'kv_blocks_total'");
  refused({{"prompt_tokens_total", "many"}}, "'prompt_tokens_total'");
  refused({{"generation_tokens_total", uint64_t{1} << 63}}, "'generation_tokens_total'");
  EXPECT_FALSE(Heartbeat::parse(Json{{"load", 3}}).ok());
  EXPECT_FALSE(Heartbeat::parse(Json("load")).ok());
  // No load at all: all zeros (a node that reports nothing yet).
  EXPECT_EQ(Heartbeat::parse(Json::object()).value().load, NodeLoad{});
}

TEST(ClusterMessages, RepliesWithoutWhatTheNodeNeedsAreRefused) {
  EXPECT_FALSE(RegistrationReply::parse(Json::object()).ok());
  EXPECT_FALSE(RegistrationReply::parse(Json{{"id", 7}}).ok());
  EXPECT_FALSE(HeartbeatReply::parse(Json{{"id", "d-1"}, {"state", "asleep"}}).ok());
  EXPECT_EQ(HeartbeatReply::parse(Json{{"id", "d-1"}}).value().state, NodeState::kUp);
}

TEST(ClusterMessages, HeartbeatCarriesTheNodesDrainOnlyWhenSet) {
  Heartbeat heartbeat;
  EXPECT_FALSE(heartbeat.to_json().contains("draining"));  // what older proxies read
  heartbeat.draining = true;
  EXPECT_TRUE(Heartbeat::parse(heartbeat.to_json()).value().draining);
  EXPECT_FALSE(Heartbeat::parse(Json::object()).value().draining);
  EXPECT_FALSE(Heartbeat::parse(Json{{"draining", 1}}).ok());
}

TEST(ClusterMessages, PrefixCacheReportRoundTripsWithHexKeys) {
  PrefixCacheReport report;
  report.block_size = 16;
  report.stored = {0, 0xffffffffffffffffULL, 0x0123456789abcdefULL};
  report.removed = {42};
  const Json json = report.to_json();
  EXPECT_EQ(json["stored"][1], "ffffffffffffffff");
  EXPECT_EQ(json["removed"][0], "000000000000002a");
  EXPECT_EQ(PrefixCacheReport::parse(json).value(), report);

  Heartbeat heartbeat;
  heartbeat.load.num_running = 2;
  heartbeat.prefix_cache = report;
  const Heartbeat parsed = Heartbeat::parse(heartbeat.to_json()).value();
  EXPECT_EQ(parsed.load, heartbeat.load);
  EXPECT_EQ(parsed.prefix_cache, report);
  // A heartbeat without the field leaves the proxy's view of the prefix cache as it was.
  EXPECT_FALSE(Heartbeat::parse(Heartbeat{}.to_json()).value().prefix_cache.has_value());
}

TEST(ClusterMessages, TieredCacheReportTravelsBesideThePoolsAndEachMayBeAbsent) {
  const PrefixCacheReport pool{16, false, {1, 2}, {3}};
  const PrefixCacheReport tiers{16, true, {3, 0xfedcba9876543210ULL}, {}};
  Heartbeat heartbeat;
  heartbeat.prefix_cache = pool;
  heartbeat.tiered_cache = tiers;
  const Json json = heartbeat.to_json();
  EXPECT_EQ(json["tiered_cache"]["stored"][1], "fedcba9876543210");
  const Heartbeat parsed = Heartbeat::parse(json).value();
  EXPECT_EQ(parsed.prefix_cache, pool);
  EXPECT_EQ(parsed.tiered_cache, tiers);

  heartbeat.prefix_cache.reset();
  const Heartbeat tiers_only = Heartbeat::parse(heartbeat.to_json()).value();
  EXPECT_FALSE(tiers_only.prefix_cache.has_value());
  EXPECT_EQ(tiers_only.tiered_cache, tiers);
  // A node without tiers sends no field: what older proxies read.
  EXPECT_FALSE(Heartbeat{}.to_json().contains("tiered_cache"));
  EXPECT_FALSE(Heartbeat::parse(Heartbeat{}.to_json()).value().tiered_cache.has_value());
}

// Both reports have the same rules and bounds; the error names the field that broke them.
class BadCacheReports : public ::testing::TestWithParam<const char*> {};

INSTANTIATE_TEST_SUITE_P(ClusterMessages, BadCacheReports,
                         ::testing::Values("prefix_cache", "tiered_cache"));

TEST_P(BadCacheReports, AreRefusedNamingTheFieldAndTheProblem) {
  const std::string field = GetParam();
  const auto refused = [&](const Json& report, const std::string& part) {
    const Result<Heartbeat> parsed = Heartbeat::parse(Json{{field, report}});
    ASSERT_FALSE(parsed.ok()) << report.dump();
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(part), std::string::npos)
        << parsed.status().message();
    EXPECT_NE(parsed.status().message().find(field), std::string::npos)
        << parsed.status().message();
  };
  const std::string key = "00000000000000ab";
  refused(Json::array(), "must be an object");
  refused({{"stored", {key}}}, "'block_size'");
  refused({{"block_size", 0}}, "'block_size'");
  refused({{"block_size", 4097}}, "'block_size'");
  refused({{"block_size", 16}, {"reset", "yes"}}, "'reset'");
  refused({{"block_size", 16}, {"stored", key}}, "'stored'");
  refused({{"block_size", 16}, {"stored", {171}}}, "16 lowercase hex digits");
  refused({{"block_size", 16}, {"stored", {"ab"}}}, "16 lowercase hex digits");
  refused({{"block_size", 16}, {"stored", {"00000000000000AB"}}}, "16 lowercase hex digits");
  refused({{"block_size", 16}, {"removed", {"-000000000000001"}}}, "16 lowercase hex digits");
  refused({{"block_size", 16}, {"stored", {"00000000000000ag"}}}, "16 lowercase hex digits");
  refused({{"block_size", 16}, {"stored", {key, key}}}, "listed twice");
  refused({{"block_size", 16}, {"stored", {key}}, {"removed", {key}}}, "listed twice");
  refused({{"block_size", 16}, {"reset", true}, {"removed", {key}}}, "'reset'");
  Json too_many = Json::array();
  for (size_t i = 0; i <= kMaxPrefixReportHashes; ++i) {
    too_many.push_back(PrefixCacheReport{16, false, {i}, {}}.to_json()["stored"][0]);
  }
  refused({{"block_size", 16}, {"stored", too_many}}, "more than");
  Json half = too_many;
  half.erase(half.begin(), half.begin() + static_cast<std::ptrdiff_t>(kMaxPrefixReportHashes / 2));
  too_many.erase(too_many.begin() + static_cast<std::ptrdiff_t>(kMaxPrefixReportHashes / 2),
                 too_many.end());
  refused({{"block_size", 16}, {"stored", too_many}, {"removed", half}}, "in all");
}

}  // namespace
}  // namespace pdserve
