// EngineCore with a scripted KvConnector, both sides of disaggregation.
// Decode side: the remotely sampled first token is streamed as soon as the connector reports
// it (before the KV lands and before any local forward), the rest comes from local decode
// steps once the KV is ready, a first token that ends the request cancels the import.
// Prefill side: an export starts before the forward of the step that completes the prompt,
// hears every layer during that forward, and finishes after the first token is sampled (or
// is aborted when the forward or the sampling fails).
// Either way the blocks stay pinned until the connector releases them. A remote prefill that
// fails is prefilled here instead.
#include <gtest/gtest.h>

#include <deque>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/engine/block_hash.h"
#include "common/engine/engine_core.h"
#include "engine_test_util.h"
#include "scripted_executor.h"
#include "scripted_tier_store.h"

namespace pdserve {
namespace {

using testing::ScriptedExecutor;

constexpr int kVocab = 151936;
constexpr int32_t kImEnd = 151645;
constexpr int32_t kPromptStart = 1000;
constexpr int kBlockSize = 4;
constexpr int kPromptLen = 10;  // three blocks

const Tokenizer& tokenizer() {
  static const Tokenizer loaded = Tokenizer::load(std::filesystem::path(PDSERVE_ASSETS_DIR) /
                                                  "qwen3-tokenizer" / "tokenizer.json")
                                      .value();
  return loaded;
}

// Records the engine's calls; the test decides which events come and when.
class ScriptedConnector : public KvConnector {
 public:
  struct Started {
    std::string request_id;
    std::vector<int32_t> block_table;
    int num_cached_tokens = 0;
    std::vector<int32_t> tokens;  // whose KV is asked for
  };

  void set_wakeup(std::function<void()>) override {}
  Status start_export(const std::string& request_id, const KvExportTarget&,
                      std::span<const int32_t> block_table, int num_prompt_tokens) override {
    if (refuse_exports) return unavailable("no route to the receiver");
    calls.push_back("start " + request_id + " " + std::to_string(block_table.size()) + " " +
                    std::to_string(num_prompt_tokens));
    return Status::ok_status();
  }
  void layer_written(int layer) override { calls.push_back("layer " + std::to_string(layer)); }
  void finish_export(const std::string& request_id) override {
    calls.push_back("finish " + request_id);
  }
  void abort_export(const std::string& request_id) override {
    calls.push_back("abort " + request_id);
  }
  Status start_import(const InferenceRequest& request, std::span<const int32_t> block_table,
                      int num_cached_tokens) override {
    started.push_back({request.id, {block_table.begin(), block_table.end()}, num_cached_tokens,
                       request.prompt_tokens});
    return Status::ok_status();
  }
  void cancel_import(const std::string& request_id) override { cancelled.push_back(request_id); }
  std::vector<KvEvent> poll() override {
    std::vector<KvEvent> out(pending.begin(), pending.end());
    pending.clear();
    return out;
  }

  void first_token(const std::string& id, int32_t token) {
    RemotePrefillResult result;
    result.first_token = token;
    result.rng_state = SamplerRng(7).state();
    result.stats.prefill_url = "http://prefill";
    result.stats.compute_seconds = 0.25;
    pending.push_back({KvEventKind::kFirstToken, id, Status::ok_status(), result, std::nullopt});
  }
  void ready(const std::string& id, int checksum_mismatches = 0) {
    RemotePrefillStats stats;
    stats.checksum_mismatches = checksum_mismatches;
    stats.refetches = checksum_mismatches;
    stats.prefill_url = "http://prefill";
    stats.compute_seconds = 0.25;
    stats.transfer_bytes = 4096;
    stats.transfer_blocks = 3;
    stats.transfer_seconds = 0.5;
    pending.push_back({KvEventKind::kImportReady, id, Status::ok_status(), std::nullopt, stats});
  }
  void failed(const std::string& id) {
    pending.push_back(
        {KvEventKind::kImportFailed, id, unavailable("link down"), std::nullopt, std::nullopt});
  }
  // `how`: OK on a confirmation, DeadlineExceeded when freed at the hold deadline.
  void released(const std::string& id, Status how = Status::ok_status()) {
    pending.push_back(
        {KvEventKind::kImportReleased, id, std::move(how), std::nullopt, std::nullopt});
  }
  void export_released(const std::string& id) {
    pending.push_back(
        {KvEventKind::kExportReleased, id, Status::ok_status(), std::nullopt, std::nullopt});
  }

  bool refuse_exports = false;
  std::vector<std::string> calls;  // export side, in order

  std::vector<Started> started;
  std::vector<std::string> cancelled;
  std::deque<KvEvent> pending;
};

using testing::Stream;

class EngineCoreKvTest : public ::testing::Test {
 protected:
  EngineCoreKvTest() : executor_(kVocab) {
    make_core(64);
    script_ = tokenizer().encode(" one two three four five six seven").value();
    executor_.set_script(kPromptStart, script_);
  }

  void make_core(int max_num_batched_tokens, KvTierStore* tiers = nullptr) {
    SchedulerConfig config;
    config.num_blocks = 32;
    config.block_size = kBlockSize;
    config.max_num_batched_tokens = max_num_batched_tokens;
    config.max_num_seqs = 8;
    config.max_num_waiting = 16;
    config.vocab_size = kVocab;
    config.eos_token_ids = {kImEnd};
    KvTierPolicy policy;
    policy.reload = KvTierPolicy::Reload::kAlways;
    EngineCoreParts parts;
    parts.connector = &connector_;
    parts.tiers = tiers;
    parts.tier_policy = policy;
    core_ = EngineCore::create(config, executor_, tokenizer(), std::move(parts)).value();
  }

  // A prefill node's request: max_tokens 1, its KV sent to a decode node.
  void add_exported(const std::string& id, int32_t prompt_start = kPromptStart) {
    InferenceRequest r;
    r.id = id;
    for (int i = 0; i < kPromptLen; ++i) r.prompt_tokens.push_back(prompt_start + i);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 1;
    r.kv_export.emplace();
    const Status added = core_->add(std::move(r), sink(id));
    ASSERT_TRUE(added.ok()) << added.to_string();
  }

  DeltaSink sink(const std::string& id) {
    return [this, id](SequenceDelta delta) {
      Stream& stream = streams_[id];
      EXPECT_EQ(stream.finals, 0) << id << ": a delta after the final one";
      if (delta.finished) ++stream.finals;
      stream.deltas.push_back(std::move(delta));
    };
  }

  void add_imported(const std::string& id, int max_tokens, std::vector<std::string> stop = {}) {
    InferenceRequest r;
    r.id = id;
    for (int i = 0; i < kPromptLen; ++i) r.prompt_tokens.push_back(kPromptStart + i);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = max_tokens;
    r.stop = std::move(stop);
    r.kv_import.emplace();
    r.kv_import->prefill_urls = {"http://prefill"};
    const Status added = core_->add(std::move(r), sink(id));
    ASSERT_TRUE(added.ok()) << added.to_string();
  }

  // Steps until the engine idles.
  void drain() {
    for (int steps = 0; core_->step(); ++steps) ASSERT_LT(steps, 1000);
  }

  void expect_all_released() {
    EXPECT_FALSE(core_->has_pending_work());
    const BlockManager& blocks = core_->scheduler().block_manager();
    EXPECT_EQ(blocks.num_used_blocks(), 0);
    const Status invariants = blocks.check_invariants();
    EXPECT_TRUE(invariants.ok()) << invariants.to_string();
  }

  ScriptedExecutor executor_;
  ScriptedConnector connector_;
  std::unique_ptr<EngineCore> core_;
  std::vector<int32_t> script_;
  std::map<std::string, Stream> streams_;
};

TEST_F(EngineCoreKvTest, TheFirstTokenStreamsBeforeTheKvLandsThenDecodingFollows) {
  add_imported("a", 5);
  ASSERT_EQ(connector_.started.size(), 1u);
  EXPECT_EQ(connector_.started[0].block_table.size(), 3u);
  EXPECT_EQ(connector_.started[0].num_cached_tokens, 0);
  drain();
  EXPECT_TRUE(streams_["a"].deltas.empty());

  connector_.first_token("a", script_[0]);
  drain();
  const Stream& stream = streams_["a"];
  ASSERT_EQ(stream.deltas.size(), 1u);
  EXPECT_EQ(stream.deltas[0].token_ids, std::vector<int32_t>{script_[0]});
  EXPECT_EQ(stream.deltas[0].text, tokenizer().decode(std::vector<int32_t>{script_[0]}).value());
  EXPECT_FALSE(stream.deltas[0].finished);
  ASSERT_TRUE(stream.deltas[0].timings.first_token.has_value());
  EXPECT_FALSE(stream.deltas[0].timings.kv_ready.has_value());
  ASSERT_TRUE(stream.deltas[0].remote_prefill.has_value());
  EXPECT_EQ(stream.deltas[0].remote_prefill->transfer_bytes, 0u);
  EXPECT_EQ(executor_.steps(), 0) << "no local forward before the KV is here";
  EXPECT_EQ(core_->scheduler().num_awaiting_kv(), 1);

  connector_.ready("a");
  drain();
  ASSERT_EQ(stream.finals, 1);
  const std::vector<int32_t> expected(script_.begin(), script_.begin() + 5);
  EXPECT_EQ(stream.tokens(), expected);
  EXPECT_EQ(stream.deltas.size(), 5u);
  EXPECT_EQ(executor_.steps(), 4);
  const SequenceDelta& last = stream.deltas.back();
  EXPECT_EQ(last.finish_reason, FinishReason::kLength);
  EXPECT_EQ(last.completion_tokens, 5);
  ASSERT_TRUE(last.timings.kv_ready && last.timings.first_scheduled && last.timings.first_token);
  EXPECT_LE(*last.timings.first_token, *last.timings.kv_ready);
  EXPECT_LE(*last.timings.kv_ready, *last.timings.first_scheduled);
  ASSERT_TRUE(last.remote_prefill.has_value());
  EXPECT_EQ(last.remote_prefill->transfer_bytes, 4096u);
  EXPECT_EQ(last.remote_prefill->transfer_blocks, 3);
  EXPECT_EQ(core_->stats().prompt_tokens_total, kPromptLen);
  EXPECT_EQ(core_->stats().generation_tokens_total, 5);
  EXPECT_TRUE(connector_.cancelled.empty());

  // The request is done but its blocks stay pinned until the connector lets them go.
  EXPECT_GT(core_->scheduler().block_manager().num_used_blocks(), 0);
  EXPECT_TRUE(core_->has_pending_work());
  connector_.released("a");
  drain();
  expect_all_released();
}

TEST_F(EngineCoreKvTest, AFirstTokenThatEndsTheRequestEndsItAtOnce) {
  struct Case {
    std::string id;
    int max_tokens;
    int32_t first;
    std::vector<std::string> stop;
    FinishReason reason;
  };
  const std::string first_text = tokenizer().decode(std::vector<int32_t>{script_[0]}).value();
  const std::vector<Case> cases = {
      {"max-tokens-1", 1, script_[0], {}, FinishReason::kLength},
      {"eos", 8, kImEnd, {}, FinishReason::kStop},
      {"stop-string", 8, script_[0], {first_text}, FinishReason::kStop},
  };
  for (const Case& c : cases) add_imported(c.id, c.max_tokens, c.stop);
  for (const Case& c : cases) connector_.first_token(c.id, c.first);
  drain();
  EXPECT_EQ(executor_.steps(), 0);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.id);
    const Stream& stream = streams_[c.id];
    ASSERT_EQ(stream.finals, 1);
    ASSERT_EQ(stream.deltas.size(), 1u);
    EXPECT_EQ(stream.deltas[0].finish_reason, c.reason);
    EXPECT_EQ(stream.tokens(), std::vector<int32_t>{c.first});
    EXPECT_TRUE(stream.deltas[0].error.ok());
  }
  EXPECT_EQ(streams_["eos"].deltas[0].text, "");  // EOS text is left out
  EXPECT_EQ(streams_["stop-string"].deltas[0].text, "");
  EXPECT_EQ(streams_["stop-string"].deltas[0].matched_stop, first_text);
  EXPECT_EQ(streams_["max-tokens-1"].deltas[0].text, first_text);
  // The stop string aborted its sequence: that KV is not wanted. The others keep importing so
  // that their prompt enters the prefix cache.
  EXPECT_EQ(connector_.cancelled, std::vector<std::string>{"stop-string"});
  EXPECT_EQ(core_->scheduler().num_awaiting_kv(), 2);

  // Nothing goes back to the pool before the connector's release.
  EXPECT_EQ(core_->scheduler().block_manager().num_used_blocks(), 9);
  connector_.ready("eos");
  connector_.failed("max-tokens-1");
  connector_.released("eos");
  connector_.released("max-tokens-1");
  drain();
  EXPECT_EQ(core_->scheduler().num_awaiting_kv(), 0);
  EXPECT_EQ(core_->scheduler().block_manager().num_used_blocks(), 3);
  connector_.released("stop-string");
  drain();
  expect_all_released();
  for (const Case& c : cases) EXPECT_EQ(streams_[c.id].finals, 1);
  // Only the landed prompt ("eos") is cached: its two full blocks.
  EXPECT_EQ(core_->scheduler().block_manager().num_cached_blocks(), 2);
}

TEST_F(EngineCoreKvTest, AbortBeforeOrAfterTheFirstTokenCancelsTheImport) {
  add_imported("waiting", 8);
  add_imported("streaming", 8);
  connector_.first_token("streaming", script_[0]);
  drain();
  core_->abort("waiting", cancelled("client left"));
  core_->abort("streaming", cancelled("client left"));
  EXPECT_EQ(connector_.cancelled, (std::vector<std::string>{"waiting", "streaming"}));
  EXPECT_EQ(streams_["waiting"].deltas.size(), 1u);
  EXPECT_EQ(streams_["streaming"].deltas.size(), 2u);
  for (const char* id : {"waiting", "streaming"}) {
    EXPECT_EQ(streams_[id].finals, 1) << id;
    EXPECT_EQ(streams_[id].deltas.back().error.code(), StatusCode::kCancelled) << id;
  }
  // Events for the aborted requests are ignored.
  connector_.first_token("waiting", script_[0]);
  connector_.ready("streaming");
  drain();
  EXPECT_EQ(executor_.steps(), 0);
  EXPECT_EQ(core_->scheduler().block_manager().num_used_blocks(), 6);
  connector_.released("waiting");
  connector_.released("streaming");
  drain();
  expect_all_released();
}

// Issue #34 item 3: import blocks the connector freed only at their hold deadline (nothing
// confirmed that no put could land) are counted for pdserve:kv_import_hold_expired_total.
TEST_F(EngineCoreKvTest, ImportBlocksFreedAtTheHoldDeadlineAreCounted) {
  add_imported("confirmed", 8);
  add_imported("expired", 8);
  drain();
  core_->abort("confirmed", cancelled("client left"));
  core_->abort("expired", cancelled("client left"));
  connector_.released("confirmed");
  connector_.released("expired", deadline_exceeded("3 KV blocks freed at the hold deadline"));
  drain();
  expect_all_released();
  EXPECT_EQ(core_->stats().kv_import_hold_expired_total, 1);
}

TEST_F(EngineCoreKvTest, ProtocolViolationsEndTheRequestWithAnError) {
  add_imported("bad-token", 8);
  add_imported("ready-too-early", 8);
  connector_.first_token("bad-token", kVocab);
  connector_.ready("ready-too-early");
  drain();
  EXPECT_EQ(streams_["bad-token"].deltas.size(), 1u);
  EXPECT_EQ(streams_["bad-token"].deltas.back().error.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(streams_["ready-too-early"].deltas.size(), 1u);
  EXPECT_EQ(streams_["ready-too-early"].deltas.back().error.code(),
            StatusCode::kFailedPrecondition);
  // The engine told the connector about the failures it found itself.
  EXPECT_EQ(connector_.cancelled, (std::vector<std::string>{"bad-token", "ready-too-early"}));
  for (const char* id : {"bad-token", "ready-too-early"}) {
    EXPECT_EQ(streams_[id].finals, 1) << id;
    connector_.released(id);
  }
  drain();
  expect_all_released();
  EXPECT_EQ(core_->stats().remote_prefill_fallbacks_total, 0);
}

// Issue #15 item 9: every prefill node failed (no first token), the KV was lost after the first
// token, or it failed its checksum: the request is prefilled here and gets the same tokens as
// a remote prefill would have given, the first token streamed once. The blocks held for the
// transfer stay used until the connector's release, and none stays used afterwards.
TEST_F(EngineCoreKvTest, AFailedRemotePrefillIsPrefilledHereWithTheSameTokens) {
  add_imported("no-prefill-node", 5);
  add_imported("lost-kv", 5);
  add_imported("corrupt-kv", 5);
  connector_.first_token("lost-kv", script_[0]);
  connector_.first_token("corrupt-kv", script_[0]);
  drain();
  EXPECT_EQ(core_->scheduler().block_manager().num_used_blocks(), 9);
  connector_.failed("no-prefill-node");
  connector_.failed("lost-kv");
  connector_.pending.push_back({KvEventKind::kImportFailed, "corrupt-kv",
                                data_loss("KV checksum mismatch"), std::nullopt, std::nullopt});
  drain();
  const std::vector<int32_t> expected(script_.begin(), script_.begin() + 5);
  for (const char* id : {"no-prefill-node", "lost-kv", "corrupt-kv"}) {
    SCOPED_TRACE(id);
    const Stream& stream = streams_[id];
    ASSERT_EQ(stream.finals, 1);
    EXPECT_TRUE(stream.last().error.ok()) << stream.last().error.to_string();
    EXPECT_EQ(stream.last().finish_reason, FinishReason::kLength);
    EXPECT_EQ(stream.tokens(), expected);
    EXPECT_EQ(stream.last().completion_tokens, 5);
    EXPECT_EQ(stream.last().prompt_tokens, kPromptLen);
  }
  // Prefilled here: chunks were recorded for the prompt computed here.
  EXPECT_FALSE(streams_["no-prefill-node"].last().timings.prefill_chunks.empty());
  const ServiceStats stats = core_->stats();
  EXPECT_EQ(stats.remote_prefill_fallbacks_total, 3);
  EXPECT_EQ(stats.kv_checksum_mismatches_total, 1);
  EXPECT_EQ(stats.prompt_tokens_total, 3 * kPromptLen);
  EXPECT_EQ(stats.generation_tokens_total, 15);
  EXPECT_TRUE(connector_.cancelled.empty()) << "the imports had ended already";
  // The three transfers' blocks (3 each) are still held; the local prefills' blocks went to
  // the prefix cache.
  EXPECT_EQ(core_->scheduler().block_manager().num_used_blocks(), 9);
  EXPECT_TRUE(core_->has_pending_work());
  for (const char* id : {"no-prefill-node", "lost-kv", "corrupt-kv"}) connector_.released(id);
  drain();
  expect_all_released();
}

// Issue #15: KV that failed its checksums and was fetched again from the next prefill node
// counts as a mismatch and a re-fetch, not as a local prefill; KV that failed on both of two
// nodes counts two mismatches, one re-fetch and one local prefill.
TEST_F(EngineCoreKvTest, RefetchedKvCountsItsMismatchesAndOnlyALastFailurePrefillsHere) {
  add_imported("refetched", 5);
  add_imported("corrupt-everywhere", 5);
  connector_.first_token("refetched", script_[0]);
  connector_.first_token("corrupt-everywhere", script_[0]);
  drain();
  connector_.ready("refetched", /*checksum_mismatches=*/1);
  RemotePrefillStats twice;
  twice.checksum_mismatches = 2;
  twice.refetches = 1;
  connector_.pending.push_back({KvEventKind::kImportFailed, "corrupt-everywhere",
                                data_loss("KV checksum mismatch"), std::nullopt, twice});
  drain();
  const std::vector<int32_t> expected(script_.begin(), script_.begin() + 5);
  for (const char* id : {"refetched", "corrupt-everywhere"}) {
    SCOPED_TRACE(id);
    ASSERT_EQ(streams_[id].finals, 1);
    EXPECT_TRUE(streams_[id].last().error.ok()) << streams_[id].last().error.to_string();
    EXPECT_EQ(streams_[id].tokens(), expected);
  }
  const ServiceStats stats = core_->stats();
  EXPECT_EQ(stats.kv_checksum_mismatches_total, 3);
  EXPECT_EQ(stats.kv_refetches_total, 2);
  EXPECT_EQ(stats.remote_prefill_fallbacks_total, 1);
  for (const char* id : {"refetched", "corrupt-everywhere"}) connector_.released(id);
  drain();
  expect_all_released();
}

// Issue #15 item 10: a stream resumed here after its decode node failed is prefilled by a
// prefill node too: the import asks for the KV of the prompt and of the delivered tokens but
// the last, the prefill node's own token is not used, and once the KV lands the stream goes
// on with the tokens an uninterrupted run gives, with no local prefill. When that import
// fails, the stream is prefilled here over the same tokens and goes on the same way.
TEST_F(EngineCoreKvTest, AResumedStreamImportsItsDeliveredTokensAndGoesOnIdentically) {
  const std::vector<int32_t> delivered(script_.begin(), script_.begin() + 3);
  for (const char* id : {"resumed", "resumed-lost"}) {
    InferenceRequest r;
    r.id = id;
    for (int i = 0; i < kPromptLen; ++i) r.prompt_tokens.push_back(kPromptStart + i);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 6;
    r.kv_import.emplace();
    r.kv_import->prefill_urls = {"http://prefill"};
    r.resume = ResumedOutput{delivered, SamplerRng(0).state()};
    const Status added = core_->add(std::move(r), sink(id));
    ASSERT_TRUE(added.ok()) << added.to_string();
  }
  ASSERT_EQ(connector_.started.size(), 2u);
  std::vector<int32_t> expected_work;
  for (int i = 0; i < kPromptLen; ++i) expected_work.push_back(kPromptStart + i);
  expected_work.insert(expected_work.end(), delivered.begin(), delivered.end() - 1);
  EXPECT_EQ(connector_.started[0].tokens, expected_work);
  EXPECT_EQ(connector_.started[0].block_table.size(), 4u) << "13 tokens in blocks of 4";

  connector_.first_token("resumed", kImEnd);  // would end the stream if it were used
  connector_.ready("resumed");
  connector_.failed("resumed-lost");
  drain();
  const std::vector<int32_t> rest(script_.begin() + 3, script_.begin() + 6);
  for (const char* id : {"resumed", "resumed-lost"}) {
    SCOPED_TRACE(id);
    const Stream& stream = streams_[id];
    ASSERT_EQ(stream.finals, 1);
    EXPECT_TRUE(stream.last().error.ok()) << stream.last().error.to_string();
    EXPECT_EQ(stream.tokens(), rest);
    EXPECT_EQ(stream.last().completion_tokens, 6);
    EXPECT_EQ(stream.last().finish_reason, FinishReason::kLength);
    ASSERT_TRUE(stream.deltas.front().resumed_text.has_value());
    EXPECT_EQ(*stream.deltas.front().resumed_text, tokenizer().decode(delivered).value());
  }
  ASSERT_TRUE(streams_["resumed"].last().remote_prefill.has_value());
  EXPECT_EQ(streams_["resumed"].last().remote_prefill->prefill_url, "http://prefill");
  EXPECT_EQ(core_->stats().remote_prefill_fallbacks_total, 1);
  for (const char* id : {"resumed", "resumed-lost"}) connector_.released(id);
  drain();
  expect_all_released();
}

// A resumed stream routed with a remote prefill whose prompt and delivered tokens (all but the
// last) are cached here already: nothing is imported, it goes on from the cache and is counted.
TEST_F(EngineCoreKvTest, AResumedStreamWhoseKvIsCachedHereImportsNothing) {
  const auto request = [&](const char* id) {
    InferenceRequest r;
    r.id = id;
    for (int i = 0; i < kPromptLen; ++i) r.prompt_tokens.push_back(kPromptStart + i);
    r.sampling.temperature = 0.0f;
    r.sampling.max_tokens = 6;
    return r;
  };
  ASSERT_TRUE(core_->add(request("first"), sink("first")).ok());
  drain();  // its full blocks (prompt + its first outputs) stay cached
  ASSERT_EQ(streams_["first"].finals, 1);
  // kPromptLen + 3 delivered tokens - 1 = a whole number of blocks, all cached.
  const size_t delivered_count = 3;
  ASSERT_EQ((kPromptLen + delivered_count - 1) % 4, 0u);
  const std::vector<int32_t> delivered(script_.begin(), script_.begin() + delivered_count);
  InferenceRequest resumed = request("resumed");
  resumed.kv_import.emplace();
  resumed.kv_import->prefill_urls = {"http://prefill"};
  resumed.resume = ResumedOutput{delivered, SamplerRng(0).state()};
  ASSERT_TRUE(core_->add(std::move(resumed), sink("resumed")).ok());
  EXPECT_TRUE(connector_.started.empty()) << "nothing to import";
  drain();
  const Stream& stream = streams_["resumed"];
  ASSERT_EQ(stream.finals, 1);
  EXPECT_TRUE(stream.last().error.ok()) << stream.last().error.to_string();
  EXPECT_EQ(stream.tokens(), std::vector<int32_t>(script_.begin() + 3, script_.begin() + 6));
  EXPECT_EQ(core_->stats().remote_prefills_served_from_cache_total, 1);
  EXPECT_EQ(core_->stats().remote_prefill_fallbacks_total, 0);
  expect_all_released();
}

TEST_F(EngineCoreKvTest, AnExportStartsBeforeTheLastChunkHearsEveryLayerAndEndsAfterSampling) {
  make_core(/*max_num_batched_tokens=*/4);  // the 10-token prompt takes three steps
  executor_.set_num_layers(3);
  add_exported("p");
  drain();
  EXPECT_EQ(executor_.steps(), 3);
  // Only the step that completes the prompt exports, with the whole prompt's table.
  const std::vector<std::string> expected = {"start p 3 10", "layer 0", "layer 1", "layer 2",
                                             "finish p"};
  EXPECT_EQ(connector_.calls, expected);
  const Stream& stream = streams_["p"];
  ASSERT_EQ(stream.finals, 1);
  EXPECT_EQ(stream.tokens(), std::vector<int32_t>{script_[0]});
  EXPECT_TRUE(stream.deltas.back().sampler_state.has_value());
  // Finished, but the puts may still read the blocks until the connector releases them.
  EXPECT_EQ(core_->scheduler().block_manager().num_used_blocks(), 3);
  EXPECT_TRUE(core_->has_pending_work());
  connector_.export_released("p");
  drain();
  expect_all_released();
}

TEST_F(EngineCoreKvTest, FailedForwardsAndSamplingAbortTheExportsTheyStarted) {
  executor_.set_num_layers(2);
  executor_.fail_at_step(1);
  add_exported("forward-fails");
  drain();
  EXPECT_EQ(connector_.calls,
            (std::vector<std::string>{"start forward-fails 3 10", "abort forward-fails"}));
  EXPECT_EQ(streams_["forward-fails"].deltas.back().error.code(), StatusCode::kInternal);

  connector_.calls.clear();
  executor_.nan_for(2000);
  add_exported("nan", 2000);
  add_exported("fine");
  drain();
  const std::vector<std::string> expected = {"start nan 3 10", "start fine 3 10", "layer 0",
                                             "layer 1",        "abort nan",       "finish fine"};
  EXPECT_EQ(connector_.calls, expected);
  EXPECT_EQ(streams_["nan"].deltas.back().error.code(), StatusCode::kInternal);
  EXPECT_TRUE(streams_["fine"].deltas.back().error.ok());
  for (const char* id : {"forward-fails", "nan", "fine"}) {
    EXPECT_EQ(streams_[id].finals, 1) << id;
    connector_.export_released(id);
  }
  drain();
  expect_all_released();
}

TEST_F(EngineCoreKvTest, AnExportThatCannotStartFailsOnlyItsRequest) {
  executor_.set_num_layers(2);
  connector_.refuse_exports = true;
  add_exported("refused");
  InferenceRequest local;
  local.id = "local";
  local.prompt_tokens = {kPromptStart, 5, 6};
  local.sampling.temperature = 0.0f;
  local.sampling.max_tokens = 3;
  ASSERT_TRUE(core_->add(std::move(local), sink("local")).ok());
  drain();
  EXPECT_TRUE(connector_.calls.empty()) << "no layer reports without a started export";
  ASSERT_EQ(streams_["refused"].finals, 1);
  EXPECT_EQ(streams_["refused"].deltas.back().error.code(), StatusCode::kUnavailable);
  EXPECT_NE(streams_["refused"].deltas.back().error.message().find("sending the KV"),
            std::string::npos);
  EXPECT_EQ(streams_["local"].tokens(), (std::vector<int32_t>{script_[0], script_[1], script_[2]}));
  expect_all_released();
}

// Issue #32: a decode node's lower KV tiers serve the prefix they hold before the remote
// prefill is asked for the rest.
TEST_F(EngineCoreKvTest, ADecodeNodesTierHitIsReloadedAndOnlyTheRestIsImported) {
  testing::ScriptedTierStore tiers;
  make_core(64, &tiers);
  uint64_t parent = kRootBlockHash;
  for (int block = 0; block < 2; ++block) {  // the prompt's first two blocks
    std::vector<int32_t> tokens;
    for (int i = 0; i < kBlockSize; ++i) tokens.push_back(kPromptStart + block * kBlockSize + i);
    parent = hash_block_tokens(parent, tokens);
    tiers.keys.insert(parent);
  }
  add_imported("a", 3);
  EXPECT_TRUE(connector_.started.empty()) << "the import waits for the reload";
  ASSERT_EQ(tiers.reloads.size(), 1u);
  EXPECT_EQ(tiers.reloads.begin()->second.size(), 2u);
  tiers.finish(tiers.reloads.begin()->first);
  drain();
  EXPECT_FALSE(core_->step());
  ASSERT_EQ(connector_.started.size(), 1u);
  EXPECT_EQ(connector_.started[0].num_cached_tokens, 2 * kBlockSize);

  connector_.first_token("a", script_[0]);
  connector_.ready("a");
  drain();
  const Stream& stream = streams_["a"];
  ASSERT_EQ(stream.finals, 1);
  EXPECT_EQ(stream.tokens(), std::vector<int32_t>(script_.begin(), script_.begin() + 3));
  const SequenceDelta& last = stream.deltas.back();
  EXPECT_TRUE(last.error.ok()) << last.error.to_string();
  EXPECT_EQ(last.cached_prompt_tokens, 2 * kBlockSize);
  ASSERT_TRUE(last.timings.kv_reload.has_value());
  EXPECT_EQ(last.timings.kv_reload->tokens, 2 * kBlockSize);
  connector_.released("a");
  drain();
  while (!tiers.offloads.empty()) {  // the finished request's blocks went to the tiers
    tiers.finish(tiers.offloads.begin()->first);
    core_->step();
  }
  expect_all_released();
  core_.reset();  // before the store it points to
}

}  // namespace
}  // namespace pdserve
