// NodeRegistry: registration input, heartbeats, expiry, failures, drain and routing order,
// with an explicit clock.
#include "proxy/routing/node_registry.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "registry_test_util.h"

namespace pdserve::proxy {
namespace {

using Json = nlohmann::json;
using Clock = NodeRegistry::Clock;
using std::chrono::milliseconds;

using testing::must_register;
using testing::registration;
using testing::test_options;

Json load(int running, int waiting, int kv_total, int kv_used) {
  return {{"load",
           {{"num_running", running},
            {"num_waiting", waiting},
            {"kv_blocks_total", kv_total},
            {"kv_blocks_used", kv_used}}}};
}

std::vector<std::string> ids(const std::vector<NodeRef>& refs) {
  std::vector<std::string> out;
  for (const NodeRef& ref : refs) out.push_back(ref.id);
  return out;
}

Json node_json(NodeRegistry& registry, const std::string& id, Clock::time_point now) {
  const Json cluster = registry.to_json(now);
  for (const Json& node : cluster["nodes"]) {
    if (node["id"] == id) return node;
  }
  return Json();
}

TEST(NodeRegistryTest, RegistrationRefusesMalformedInput) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  const std::vector<std::pair<Json, std::string>> cases = {
      {Json::array(), "not a JSON object"},
      {Json{{"url", "http://127.0.0.1:1"}}, "'role'"},
      {Json{{"role", "router"}, {"url", "http://127.0.0.1:1"}}, "'role'"},
      {Json{{"role", "decode"}}, "'url'"},
      {Json{{"role", "decode"}, {"url", 5}}, "'url'"},
      {Json{{"role", "decode"}, {"url", "ftp://127.0.0.1:1"}}, "http://"},
      {Json{{"role", "decode"}, {"url", "http://127.0.0.1:1/v1"}}, "no path"},
      {Json{{"role", "decode"}, {"url", "http://127.0.0.1:99999"}}, "invalid port"},
      {Json{{"role", "decode"}, {"url", "http://:80"}}, "no valid host"},
      {Json{{"role", "decode"}, {"url", "http://127.0.0.1:1"}, {"kv_descriptor", 1}},
       "'kv_descriptor'"},
  };
  for (const auto& [body, expected] : cases) {
    Result<std::string> id = registry.register_node(body, now);
    ASSERT_FALSE(id.ok()) << body.dump();
    EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument) << body.dump();
    EXPECT_NE(id.status().message().find(expected), std::string::npos)
        << body.dump() << ": " << id.status().message();
  }
  EXPECT_TRUE(registry.to_json(now)["nodes"].empty());
}

// The model name reaches /v1/models and the logs: it must be a name, not any string.
TEST(NodeRegistryTest, RegistrationRefusesAMissingOverLongOrControlCharacterModelName) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  const std::string longest(NodeRegistry::kMaxModelNameBytes, 'm');
  const std::vector<std::pair<std::optional<std::string>, std::string>> refused = {
      {std::nullopt, "must name"},
      {"", "must name"},
      {longest + "m", "longer than 256 bytes"},
      {std::string(100'000, 'm'), "longer than 256 bytes"},
      {"qwen\nINFO forged log line", "control character"},
      {std::string("qwen\0", 5), "control character"},
      {"qwen\x7f", "control character"},
  };
  for (const auto& [model, expected] : refused) {
    Json body = registration("decode", 9000);
    if (model) {
      body["model"] = *model;
    } else {
      body.erase("model");
    }
    Result<std::string> id = registry.register_node(body, now);
    ASSERT_FALSE(id.ok()) << body.dump().substr(0, 80);
    EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(id.status().message().find("'model'"), std::string::npos) << id.status().message();
    EXPECT_NE(id.status().message().find(expected), std::string::npos) << id.status().message();
  }
  EXPECT_TRUE(registry.to_json(now)["nodes"].empty());
  // At the bound, and any UTF-8 name, is a name.
  for (const std::string& model : {longest, std::string("Qwen/Qwen3-0.6B"), std::string("模型 ü")}) {
    Json body = registration("decode", 9000);
    body["model"] = model;
    Result<std::string> id = registry.register_node(body, now);
    ASSERT_TRUE(id.ok()) << model << ": " << id.status().to_string();
    ASSERT_TRUE(registry.remove(*id).ok());
  }
}

TEST(NodeRegistryTest, SecondLiveNodeAtTheSameAddressIsRefused) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  const std::string first = must_register(registry, "decode", 9000, now);
  Json same = registration("prefill", 9000);
  same["url"] = "http://127.0.0.1:9000/";  // the same address, spelled differently
  Result<std::string> second = registry.register_node(same, now + milliseconds(10));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find(first), std::string::npos);
}

TEST(NodeRegistryTest, RestartedNodeReplacesItsStaleOrDownEntry) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  const std::string silent = must_register(registry, "decode", 9000, now);
  const std::string again = must_register(registry, "decode", 9000, now + milliseconds(1'500));
  EXPECT_NE(again, silent);
  EXPECT_TRUE(node_json(registry, silent, now).is_null());

  registry.mark_down(again, now + milliseconds(1'600));
  const std::string third = must_register(registry, "decode", 9000, now + milliseconds(1'700));
  EXPECT_EQ(registry.to_json(now)["nodes"].size(), 1u);
  EXPECT_FALSE(node_json(registry, third, now).is_null());

  // A node registering at a static node's address takes it over.
  ASSERT_TRUE(registry.add_static(NodeRole::kPrefill, "http://127.0.0.1:9100").ok());
  const std::string owner = must_register(registry, "prefill", 9100, now);
  EXPECT_EQ(registry.to_json(now)["nodes"].size(), 2u);
  EXPECT_EQ(node_json(registry, owner, now)["static"], false);
}

TEST(NodeRegistryTest, StaticNodeNeedsAValidUrl) {
  NodeRegistry registry(test_options());
  Result<std::string> id = registry.add_static(NodeRole::kDecode, "127.0.0.1:9000");
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
}

TEST(NodeRegistryTest, HeartbeatFromUnknownIdIsNotFoundAndKnownOneUpdatesLoad) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  Result<NodeState> unknown = registry.heartbeat("decode-42", load(1, 0, 10, 1), now);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("decode-42"), std::string::npos);

  const std::string id = must_register(registry, "decode", 9000, now);
  Result<NodeState> state = registry.heartbeat(id, load(3, 2, 100, 25), now);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(*state, NodeState::kUp);
  const Json node = node_json(registry, id, now);
  EXPECT_EQ(node["load"]["num_running"], 3);
  EXPECT_EQ(node["load"]["num_waiting"], 2);
  EXPECT_DOUBLE_EQ(node["load"]["kv_usage"].get<double>(), 0.25);
}

TEST(NodeRegistryTest, ImpossibleLoadIsRefusedAndChangesNothing) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  const std::string id = must_register(registry, "decode", 9000, now);
  ASSERT_TRUE(registry.heartbeat(id, load(3, 2, 100, 25), now).ok());
  const std::vector<Json> refused = {
      Json("garbage"),
      Json{{"load", 5}},
      load(-1, 0, 100, 25),
      load(3, -1, 100, 25),
      load(3, 2, -100, -200),
      load(3, 2, 100, -1000),
      load(3, 2, 100, 101),
      Json{{"load", {{"num_running", 2.5}}}},
      Json{{"load", {{"kv_blocks_used", "0"}}}},
      Json{{"load", {{"num_waiting", uint64_t{1} << 32}}}},
  };
  for (const Json& body : refused) {
    Result<NodeState> state = registry.heartbeat(id, body, now + milliseconds(900));
    ASSERT_FALSE(state.ok()) << body.dump();
    EXPECT_EQ(state.status().code(), StatusCode::kInvalidArgument) << body.dump();
  }
  const Json node = node_json(registry, id, now);
  EXPECT_EQ(node["load"]["num_running"], 3);
  EXPECT_EQ(node["load"]["kv_blocks_used"], 25);
  // Nor do refused reports keep the node alive.
  registry.expire(now + milliseconds(1'100));
  EXPECT_TRUE(node_json(registry, id, now).is_null());

  Json negative_capacity = registration("decode", 9001);
  negative_capacity["kv_blocks_total"] = -1;
  EXPECT_EQ(registry.register_node(negative_capacity, now).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(NodeRegistryTest, RegisteredNodesExpireWithoutHeartbeatsStaticOnesDoNot) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  const std::string registered = must_register(registry, "decode", 9000, now);
  ASSERT_TRUE(registry.add_static(NodeRole::kDecode, "http://127.0.0.1:9001").ok());

  registry.expire(now + milliseconds(900));
  EXPECT_EQ(registry.to_json(now)["nodes"].size(), 2u);
  ASSERT_TRUE(registry.heartbeat(registered, load(0, 0, 10, 0), now + milliseconds(900)).ok());
  registry.expire(now + milliseconds(1'800));  // 900 ms after the heartbeat
  EXPECT_EQ(registry.to_json(now)["nodes"].size(), 2u);
  registry.expire(now + milliseconds(2'000));
  EXPECT_TRUE(node_json(registry, registered, now).is_null());
  EXPECT_EQ(registry.to_json(now)["nodes"].size(), 1u);  // the static one stays
  EXPECT_EQ(registry.heartbeat(registered, Json::object(), now).status().code(),
            StatusCode::kNotFound);  // expired, not drained: it may register again
}

TEST(NodeRegistryTest, MarkDownRegisteredUntilHeartbeatStaticUntilCooldown) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  const std::string registered = must_register(registry, "decode", 9000, now);
  registry.mark_down(registered, now);
  EXPECT_FALSE(registry.pick_decode({}, now));
  EXPECT_FALSE(registry.has_node(NodeRole::kDecode, now));
  ASSERT_TRUE(registry.heartbeat(registered, Json::object(), now + milliseconds(10)).ok());
  ASSERT_TRUE(registry.pick_decode({}, now + milliseconds(10)));

  NodeRegistry statics(test_options());
  Result<std::string> id = statics.add_static(NodeRole::kPrefill, "http://127.0.0.1:9100");
  ASSERT_TRUE(id.ok());
  statics.mark_down(*id, now);
  EXPECT_TRUE(statics.rank_prefill(now + milliseconds(499)).empty());
  EXPECT_EQ(node_json(statics, *id, now)["state"], "down");
  EXPECT_EQ(ids(statics.rank_prefill(now + milliseconds(500))), std::vector<std::string>{*id});
  statics.mark_down("prefill-999", now);  // unknown: ignored
}

TEST(NodeRegistryTest, DrainStopsNewWorkWaitsForInFlightThenRetires) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  const std::string draining = must_register(registry, "decode", 9000, now);
  const std::string other = must_register(registry, "decode", 9001, now);
  // `draining` is the better choice until it drains.
  ASSERT_TRUE(registry.heartbeat(other, load(5, 0, 100, 50), now).ok());
  ASSERT_EQ(registry.pick_decode({}, now)->id, draining);
  registry.begin_request(draining, "", 0);

  EXPECT_EQ(registry.drain("decode-999").code(), StatusCode::kNotFound);
  ASSERT_TRUE(registry.drain(draining).ok());
  EXPECT_EQ(registry.pick_decode({}, now)->id, other);
  Result<NodeState> state = registry.heartbeat(draining, Json::object(), now);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(*state, NodeState::kDraining);
  registry.mark_down(draining, now);  // a draining node stays draining
  EXPECT_EQ(node_json(registry, draining, now)["state"], "draining");

  // Its request is still in flight: it stays, even past the heartbeat timeout.
  registry.expire(now + milliseconds(5'000));
  EXPECT_FALSE(node_json(registry, draining, now).is_null());
  registry.end_request(draining, "", 0);
  registry.expire(now + milliseconds(5'000));
  EXPECT_TRUE(node_json(registry, draining, now).is_null());
  // Retired: its heartbeat is refused as gone, not unknown, so it does not register again.
  Result<NodeState> gone = registry.heartbeat(draining, Json::object(), now);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(gone.status().message().find("drained"), std::string::npos);
}

TEST(NodeRegistryTest, AHeartbeatSayingDrainingDrainsTheNodeHereToo) {
  // A node registered with several proxies and drained at one says so in its heartbeats to
  // the others: they stop sending it work and retire it once their requests there are done.
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  const std::string id = must_register(registry, "decode", 9000, now);
  registry.begin_request(id, "", 0);
  Result<NodeState> state = registry.heartbeat(id, Json{{"draining", true}}, now);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(*state, NodeState::kDraining);
  EXPECT_FALSE(registry.pick_decode({}, now));
  // A later heartbeat without the flag does not bring it back.
  EXPECT_EQ(registry.heartbeat(id, Json::object(), now).value(), NodeState::kDraining);
  registry.end_request(id, "", 0);
  registry.expire(now);
  EXPECT_EQ(registry.heartbeat(id, Json::object(), now).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry.heartbeat(must_register(registry, "decode", 9001, now),
                               Json{{"draining", "yes"}}, now)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

TEST(NodeRegistryTest, DrainedStaticNodeIsRemovedToo) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  Result<std::string> id = registry.add_static(NodeRole::kPrefill, "http://127.0.0.1:9100");
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(registry.drain(*id).ok());
  EXPECT_TRUE(registry.rank_prefill(now).empty());
  registry.expire(now);
  EXPECT_TRUE(registry.to_json(now)["nodes"].empty());
}

TEST(NodeRegistryTest, PickDecodePrefersLowKvUsageThenFewestSequencesAndHonoursExclusions) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  const std::string full = must_register(registry, "decode", 9000, now);
  const std::string busy = must_register(registry, "decode", 9001, now);
  const std::string quiet = must_register(registry, "decode", 9002, now);
  must_register(registry, "prefill", 9003, now);  // never a decode choice
  ASSERT_TRUE(registry.heartbeat(full, load(1, 0, 100, 90), now).ok());
  ASSERT_TRUE(registry.heartbeat(busy, load(4, 1, 100, 10), now).ok());
  ASSERT_TRUE(registry.heartbeat(quiet, load(1, 0, 100, 10), now).ok());

  EXPECT_EQ(registry.pick_decode({}, now)->id, quiet);
  // The proxy's own in-flight requests count as sequences: 1 + 5 > 5.
  for (int i = 0; i < 5; ++i) registry.begin_request(quiet, "", 0);
  EXPECT_EQ(registry.pick_decode({}, now)->id, busy);
  EXPECT_EQ(registry.pick_decode({busy}, now)->id, quiet);
  EXPECT_EQ(registry.pick_decode({busy, quiet}, now)->id, full);
  EXPECT_FALSE(registry.pick_decode({busy, quiet, full}, now));
  // Silent past the heartbeat timeout: not routable even before expire() runs.
  EXPECT_FALSE(registry.pick_decode({}, now + milliseconds(1'001)));
}

TEST(NodeRegistryTest, RankPrefillOrdersByOutstandingPromptTokensAndSkipsUnroutable) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  const std::string a = must_register(registry, "prefill", 9000, now);
  const std::string b = must_register(registry, "prefill", 9001, now);
  const std::string c = must_register(registry, "prefill", 9002, now);
  const std::string d = must_register(registry, "prefill", 9003, now);
  const std::string decode = must_register(registry, "decode", 9004, now);
  registry.begin_request(decode, a, 500);
  registry.begin_request(decode, b, 100);
  ASSERT_TRUE(registry.heartbeat(c, load(0, 3, 0, 0), now).ok());  // waiting breaks the tie
  registry.mark_down(d, now);
  EXPECT_EQ(ids(registry.rank_prefill(now)), (std::vector<std::string>{c, b, a}));

  registry.end_request(decode, a, 500);
  EXPECT_EQ(ids(registry.rank_prefill(now)), (std::vector<std::string>{a, c, b}));
  ASSERT_TRUE(registry.drain(a).ok());
  EXPECT_EQ(ids(registry.rank_prefill(now)), (std::vector<std::string>{c, b}));
  // Ending more than began never goes below zero.
  registry.end_request(decode, b, 1'000);
  registry.end_request(decode, b, 1'000);
  EXPECT_EQ(node_json(registry, b, now)["load"]["proxy_in_flight_prompt_tokens"], 0);
  EXPECT_EQ(node_json(registry, b, now)["load"]["proxy_in_flight"], 0);
}

Json prefix_report(const std::vector<uint64_t>& keys, bool reset = false) {
  return PrefixCacheReport{4, reset, keys, {}}.to_json();
}

Json load_and_prefix(int running, int kv_used, const std::vector<uint64_t>& keys) {
  Json body = load(running, 0, 100, kv_used);
  body["prefix_cache"] = prefix_report(keys);
  return body;
}

TEST(NodeRegistryTest, TheDecodeNodeHoldingThePromptsPrefixWinsUntilItsLoadOutweighsIt) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  const std::string holder = must_register(registry, "decode", 9000, now);
  const std::string idle = must_register(registry, "decode", 9001, now);
  std::vector<int32_t> prompt(41);  // 10 reusable blocks of 4
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i + 7);
  const std::vector<uint64_t> chain = reusable_block_chain(prompt, 4);
  ASSERT_TRUE(registry.heartbeat(holder, load_and_prefix(2, 20, chain), now).ok());
  ASSERT_TRUE(registry.heartbeat(idle, load(0, 0, 100, 0), now).ok());
  const RoutingQuery query{prompt, 41};

  // Without the prompt, load decides; with it, the holder's full hit (1.0) beats its load
  // (0.2 KV + 2 x 0.1 sequences).
  EXPECT_EQ(registry.pick_decode({}, now)->id, idle);
  const std::optional<NodeRef> picked = registry.pick_decode({}, now, query);
  ASSERT_TRUE(picked);
  EXPECT_EQ(picked->id, holder);
  EXPECT_EQ(picked->prompt_blocks, 10u);
  EXPECT_EQ(picked->hit_blocks, 10u);
  // A prompt that only shares the first half of the blocks hits half.
  std::vector<int32_t> other = prompt;
  other[25] = 99'999;
  const std::optional<NodeRef> half = registry.pick_decode({}, now, {other, 41});
  EXPECT_EQ(half->id, holder);
  EXPECT_EQ(half->hit_blocks, 6u);
  // Nine more sequences there: 0.2 + 1.1 - 1 > 0, the idle node wins.
  for (int i = 0; i < 9; ++i) registry.begin_request(holder, "", 0);
  EXPECT_EQ(registry.pick_decode({}, now, query)->id, idle);
  EXPECT_EQ(registry.pick_decode({}, now, query)->hit_blocks, 0u);
}

TEST(NodeRegistryTest, ZeroPrefixWeightIsCacheUnaware) {
  RegistryOptions options = test_options();
  options.weights.prefix = 0.0;
  NodeRegistry registry(options);
  const auto now = Clock::now();
  const std::string holder = must_register(registry, "decode", 9000, now);
  const std::string idle = must_register(registry, "decode", 9001, now);
  const std::vector<int32_t> prompt(9, 3);
  ASSERT_TRUE(
      registry.heartbeat(holder, load_and_prefix(1, 10, reusable_block_chain(prompt, 4)), now).ok());
  EXPECT_EQ(registry.pick_decode({}, now, {prompt, 9})->id, idle);
}

TEST(NodeRegistryTest, PrefillNodesHoldingThePrefixRankFirst) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  const std::string a = must_register(registry, "prefill", 9000, now);
  const std::string b = must_register(registry, "prefill", 9001, now);
  const std::string decode = must_register(registry, "decode", 9002, now);
  const std::vector<int32_t> prompt(41, 5);
  ASSERT_TRUE(
      registry.heartbeat(b, load_and_prefix(0, 0, reusable_block_chain(prompt, 4)), now).ok());
  EXPECT_EQ(ids(registry.rank_prefill(now)), (std::vector<std::string>{a, b}));
  EXPECT_EQ(ids(registry.rank_prefill(now, {prompt, 41})), (std::vector<std::string>{b, a}));
  // 41 tokens queued on b: one prompt-length of work, as much as its hit saves.
  registry.begin_request(decode, b, 45);
  EXPECT_EQ(ids(registry.rank_prefill(now, {prompt, 41})), (std::vector<std::string>{a, b}));
}

TEST(NodeRegistryTest, PrefixKeysAreBoundedPerNodeAndLeaveWithTheNode) {
  RegistryOptions options = test_options();
  options.prefix_keys_per_node = 5;
  NodeRegistry registry(options);
  const auto now = Clock::now();
  const std::string a = must_register(registry, "decode", 9000, now);
  const std::string b = must_register(registry, "prefill", 9001, now);
  ASSERT_TRUE(registry.heartbeat(a, load_and_prefix(0, 0, {1, 2, 3, 4, 5, 6, 7}), now).ok());
  ASSERT_TRUE(registry.heartbeat(b, load_and_prefix(0, 0, {1, 2, 3}), now).ok());
  EXPECT_EQ(registry.prefix_keys(), 8u);
  EXPECT_EQ(node_json(registry, a, now)["prefix_cache"]["keys"], 5);
  // A reset report replaces the node's keys.
  Json reset = load(0, 0, 100, 0);
  reset["prefix_cache"] = prefix_report({9}, true);
  ASSERT_TRUE(registry.heartbeat(a, reset, now).ok());
  EXPECT_EQ(registry.prefix_keys(), 4u);
  ASSERT_TRUE(registry.remove(b).ok());
  EXPECT_EQ(registry.prefix_keys(), 1u);
  registry.expire(now + milliseconds(1'001));  // a falls silent
  EXPECT_EQ(registry.prefix_keys(), 0u);
}

TEST(NodeRegistryTest, ABadPrefixReportIsRefusedAndChangesNothing) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  const std::string node = must_register(registry, "decode", 9000, now);
  ASSERT_TRUE(registry.heartbeat(node, load_and_prefix(1, 10, {1, 2}), now).ok());
  Json bad = load_and_prefix(3, 30, {3});
  bad["prefix_cache"]["stored"].push_back("not-a-key");
  const Result<NodeState> refused = registry.heartbeat(node, bad, now + milliseconds(900));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.prefix_keys(), 2u);
  EXPECT_EQ(node_json(registry, node, now)["load"]["num_running"], 1);
  // Nor its liveness: silent since `now`, it is gone after the timeout.
  EXPECT_TRUE(registry.expire(now + milliseconds(1'001)).size() == 1);
}

TEST(NodeRegistryTest, PoolLoadSumsRoutableNodesOfOneRole) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  const std::string d1 = must_register(registry, "decode", 9000, now);
  const std::string d2 = must_register(registry, "decode", 9001, now);
  const std::string down = must_register(registry, "decode", 9002, now);
  const std::string p1 = must_register(registry, "prefill", 9003, now);
  ASSERT_TRUE(registry.heartbeat(d1, load(2, 1, 100, 30), now).ok());
  ASSERT_TRUE(registry.heartbeat(d2, load(3, 0, 50, 10), now).ok());
  registry.mark_down(down, now);
  registry.begin_request(d1, p1, 700);

  const PoolLoad decode = registry.pool_load(NodeRole::kDecode, now);
  EXPECT_EQ(decode.nodes, 2);
  EXPECT_EQ(decode.running, 5);
  EXPECT_EQ(decode.waiting, 1);
  EXPECT_EQ(decode.kv_blocks_total, 150);
  EXPECT_EQ(decode.kv_blocks_used, 40);
  EXPECT_EQ(decode.in_flight, 1);
  const PoolLoad prefill = registry.pool_load(NodeRole::kPrefill, now);
  EXPECT_EQ(prefill.nodes, 1);
  EXPECT_EQ(prefill.queued_prompt_tokens, 700);
}

// GET /cluster/kv-peers: the descriptors the registered decode nodes sent, whatever their state;
// a prefill node's, a static node's (none) and a departed node's are not in it (issue #34).
TEST(NodeRegistry, ListsTheKvDescriptorsOfRegisteredDecodeNodesOnly) {
  NodeRegistry registry(test_options());
  const auto now = Clock::now();
  const auto with_descriptor = [&](const std::string& role, int port, const std::string& kv) {
    Json body = registration(role, port);
    body["kv_descriptor"] = kv;
    Result<std::string> id = registry.register_node(body, now);
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    return id.ok() ? *id : std::string();
  };
  const std::string up = with_descriptor("decode", 9001, "ZGVjb2RlLTE=");
  const std::string draining = with_descriptor("decode", 9002, "ZGVjb2RlLTI=");
  const std::string gone = with_descriptor("decode", 9003, "ZGVjb2RlLTM=");
  with_descriptor("prefill", 9004, "cHJlZmlsbA==");
  with_descriptor("decode", 9005, "");  // colocated: no KV transfer
  ASSERT_TRUE(registry.add_static(NodeRole::kDecode, "http://127.0.0.1:9006").ok());
  ASSERT_TRUE(registry.drain(draining).ok());
  registry.begin_request(draining, "", 1);  // in flight: it stays registered while it drains
  ASSERT_TRUE(registry.remove(gone).ok());
  registry.mark_down(up, now);

  const KvPeerList peers = registry.decode_kv_peers();
  EXPECT_EQ(peers.kv_descriptors, (std::vector<std::string>{"ZGVjb2RlLTE=", "ZGVjb2RlLTI="}));
  Result<KvPeerList> parsed = KvPeerList::parse(peers.to_json());
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(*parsed, peers);
}

TEST(KvPeerList, RefusesAnythingButAnArrayOfStrings) {
  for (const char* text : {R"([])", R"({})", R"({"kv_descriptors": "x"})",
                           R"({"kv_descriptors": ["a", 1]})"}) {
    EXPECT_EQ(KvPeerList::parse(Json::parse(text)).status().code(), StatusCode::kInvalidArgument)
        << text;
  }
  Json many = {{"kv_descriptors", Json::array()}};
  for (size_t i = 0; i <= KvPeerList::kMaxDescriptors; ++i) many["kv_descriptors"].push_back("a");
  EXPECT_EQ(KvPeerList::parse(many).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::proxy
