// KvTransferCoordinator over a real Scheduler and a recording connector: the pin rule (a block
// is not freed while an export may still read it or an import may still land in it, however
// its request ended), exports finished or aborted with their step, a transfer that cannot
// start leaving nothing pinned, and import events routed by whether their request still runs.
// (The whole engine with a connector: EngineCoreKvTest.)
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/engine/kv_transfer_coordinator.h"
#include "engine_test_util.h"

namespace pdserve {
namespace {

using testing::greedy_params;
using testing::iota_tokens;
using testing::kTestEos;
using testing::kTestVocab;

class RecordingConnector : public KvConnector {
 public:
  void set_wakeup(std::function<void()>) override {}
  Status start_export(const std::string& request_id, const KvExportTarget&,
                      std::span<const int32_t> block_table, int num_prompt_tokens) override {
    if (refuse) return unavailable("no route");
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
    if (refuse) return unavailable("no prefill node");
    calls.push_back("import " + request.id + " " + std::to_string(block_table.size()) + " " +
                    std::to_string(num_cached_tokens));
    return Status::ok_status();
  }
  void cancel_import(const std::string& request_id) override {
    calls.push_back("cancel " + request_id);
  }
  std::vector<KvEvent> poll() override { return std::exchange(events, {}); }

  void push(KvEventKind kind, const std::string& id) {
    KvEvent event;
    event.kind = kind;
    event.request_id = id;
    if (kind == KvEventKind::kImportReady) event.stats.emplace();
    if (kind == KvEventKind::kImportFailed) event.status = unavailable("link down");
    events.push_back(std::move(event));
  }

  bool refuse = false;
  std::vector<std::string> calls;
  std::vector<KvEvent> events;
};

class Requests : public ImportListener {
 public:
  std::optional<SeqId> live_sequence(const std::string& request_id) const override {
    auto it = live.find(request_id);
    if (it == live.end()) return std::nullopt;
    return it->second;
  }
  void import_first_token(const std::string& request_id, SeqId, RemotePrefillResult) override {
    heard.push_back("first token " + request_id);
  }
  void import_ready(const std::string& request_id, SeqId, RemotePrefillStats) override {
    heard.push_back("ready " + request_id);
  }

  std::map<std::string, SeqId> live;
  std::vector<std::string> heard;
};

class KvTransferCoordinatorTest : public ::testing::Test {
 protected:
  KvTransferCoordinatorTest()
      : scheduler_(make_scheduler()), coordinator_(&connector_, scheduler_) {}

  static Scheduler make_scheduler() {
    SchedulerConfig config;
    config.num_blocks = 16;
    config.block_size = 4;
    config.max_num_batched_tokens = 32;
    config.max_num_seqs = 8;
    config.max_num_waiting = 16;
    config.vocab_size = kTestVocab;
    config.eos_token_ids = {kTestEos};
    return Scheduler::create(config).value();
  }

  int used_blocks() const { return scheduler_.block_manager().num_used_blocks(); }
  void expect_consistent() const {
    const Status invariants = scheduler_.block_manager().check_invariants();
    EXPECT_TRUE(invariants.ok()) << invariants.to_string();
  }

  RecordingConnector connector_;
  Requests requests_;
  Scheduler scheduler_;
  KvTransferCoordinator coordinator_;
};

TEST_F(KvTransferCoordinatorTest, AnExportedBlockIsNotFreedUntilTheConnectorReleasesIt) {
  // Two prompts of 10 tokens (3 blocks each), one token each: the step finishes both.
  const SeqId p = scheduler_.add_request(iota_tokens(10, 1), greedy_params(1)).value();
  const SeqId q = scheduler_.add_request(iota_tokens(10, 20), greedy_params(1)).value();
  ScheduledBatch batch = scheduler_.schedule();
  ASSERT_EQ(batch.entries.size(), 2u);
  EXPECT_FALSE(coordinator_.layer_listener()) << "no export started yet";
  for (const ScheduledSequence& entry : batch.entries) {
    const std::string id = entry.sequence->id() == p ? "p" : "q";
    ASSERT_TRUE(
        coordinator_.start_export(id, KvExportTarget{}, entry.sequence->id(), entry.block_table, 10)
            .ok());
  }
  const LayerKvWritten listener = coordinator_.layer_listener();
  ASSERT_TRUE(listener);
  listener(0);
  // q's request failed during the step (its sampling): its export must not complete. The
  // engine finishes the exports after sampling, before the scheduler applies the tokens.
  ASSERT_TRUE(scheduler_.abort(q).ok());
  coordinator_.finish_step_exports();
  ASSERT_TRUE(scheduler_.postprocess(batch, std::vector<int32_t>{5, 5}).ok());
  EXPECT_EQ(connector_.calls, (std::vector<std::string>{"start p 3 10", "start q 3 10", "layer 0",
                                                        "finish p", "abort q"}));
  EXPECT_EQ(scheduler_.find(p), nullptr) << "p finished";
  EXPECT_FALSE(coordinator_.layer_listener()) << "the next step has no export of its own";

  // Both requests are over, but the puts may still read their blocks.
  EXPECT_EQ(used_blocks(), 6);
  EXPECT_TRUE(coordinator_.has_pinned());
  connector_.push(KvEventKind::kExportReleased, "p");
  coordinator_.apply_events(requests_);
  EXPECT_EQ(used_blocks(), 3);
  connector_.push(KvEventKind::kExportReleased, "q");
  connector_.push(KvEventKind::kExportReleased, "unknown");  // ignored
  coordinator_.apply_events(requests_);
  EXPECT_EQ(used_blocks(), 0);
  EXPECT_FALSE(coordinator_.has_pinned());
  expect_consistent();
}

TEST_F(KvTransferCoordinatorTest, AFailedStepAbortsItsExportsAndARefusedOneLeavesNothingPinned) {
  const SeqId p = scheduler_.add_request(iota_tokens(10, 1), greedy_params(1)).value();
  ScheduledBatch batch = scheduler_.schedule();
  ASSERT_TRUE(
      coordinator_.start_export("p", KvExportTarget{}, p, batch.entries[0].block_table, 10).ok());
  coordinator_.abort_step_exports();
  ASSERT_TRUE(scheduler_.abort(p).ok());
  ASSERT_TRUE(scheduler_.postprocess(batch, std::vector<int32_t>{0}).ok());
  EXPECT_EQ(connector_.calls, (std::vector<std::string>{"start p 3 10", "abort p"}));
  EXPECT_EQ(used_blocks(), 3) << "pinned until the release";
  connector_.push(KvEventKind::kExportReleased, "p");
  coordinator_.apply_events(requests_);
  EXPECT_EQ(used_blocks(), 0);

  connector_.calls.clear();
  connector_.refuse = true;
  const SeqId r = scheduler_.add_request(iota_tokens(10, 1), greedy_params(1)).value();
  batch = scheduler_.schedule();
  EXPECT_EQ(
      coordinator_.start_export("r", KvExportTarget{}, r, batch.entries[0].block_table, 10).code(),
      StatusCode::kUnavailable);
  EXPECT_FALSE(coordinator_.layer_listener());
  ASSERT_TRUE(scheduler_.abort(r).ok());
  ASSERT_TRUE(scheduler_.postprocess(batch, std::vector<int32_t>{0}).ok());
  EXPECT_EQ(used_blocks(), 0);
  EXPECT_FALSE(coordinator_.has_pinned());

  InferenceRequest refused_import;
  refused_import.id = "i";
  const SeqId i = scheduler_.add_imported_request(iota_tokens(10, 1), greedy_params(4)).value();
  EXPECT_EQ(coordinator_.start_import(refused_import, i).code(), StatusCode::kUnavailable);
  EXPECT_FALSE(coordinator_.importing("i"));
  ASSERT_TRUE(scheduler_.abort(i).ok());
  EXPECT_EQ(used_blocks(), 0);
  EXPECT_TRUE(connector_.calls.empty());
  expect_consistent();
}

TEST_F(KvTransferCoordinatorTest, ImportedBlocksAreHeldUntilTheReleaseWhateverTheRequestBecame) {
  InferenceRequest request;
  request.id = "fails";
  const SeqId fails = scheduler_.add_imported_request(iota_tokens(10, 1), greedy_params(4)).value();
  ASSERT_TRUE(coordinator_.start_import(request, fails).ok());
  request.id = "ended";
  const SeqId ended =
      scheduler_.add_imported_request(iota_tokens(10, 30), greedy_params(1)).value();
  ASSERT_TRUE(coordinator_.start_import(request, ended).ok());
  EXPECT_EQ(connector_.calls, (std::vector<std::string>{"import fails 3 0", "import ended 3 0"}));
  EXPECT_TRUE(coordinator_.importing("fails"));
  requests_.live = {{"fails", fails}, {"ended", ended}};

  // Live requests hear their first token and their landed KV.
  connector_.events.push_back(
      {KvEventKind::kFirstToken, "ended", Status::ok_status(), RemotePrefillResult{}, {}});
  coordinator_.apply_events(requests_);
  EXPECT_EQ(requests_.heard, std::vector<std::string>{"first token ended"});

  // "fails" is prefilled here instead: its old blocks go to a holder, still pinned.
  connector_.push(KvEventKind::kImportFailed, "fails");
  coordinator_.apply_events(requests_);
  EXPECT_EQ(scheduler_.num_waiting(), 1);
  ServiceStats stats;
  coordinator_.fill_stats(stats);
  EXPECT_EQ(stats.remote_prefill_fallbacks_total, 1);

  // "ended" finished with its first token (max_tokens 1); its KV still lands into the prefix
  // cache, without a word to the request.
  ASSERT_TRUE(scheduler_.accept_remote_first_token(ended, 7).ok());
  requests_.live.erase("ended");
  connector_.push(KvEventKind::kImportReady, "ended");
  coordinator_.apply_events(requests_);
  EXPECT_EQ(requests_.heard.size(), 1u);
  EXPECT_EQ(scheduler_.num_awaiting_kv(), 0);
  EXPECT_EQ(scheduler_.find(ended), nullptr);

  ASSERT_TRUE(scheduler_.abort(fails).ok());  // the local prefill is cancelled too
  EXPECT_EQ(used_blocks(), 6) << "no put may land anywhere else than where it was sent";
  connector_.push(KvEventKind::kImportReleased, "fails");
  connector_.push(KvEventKind::kImportReleased, "ended");
  coordinator_.apply_events(requests_);
  EXPECT_EQ(used_blocks(), 0);
  EXPECT_EQ(scheduler_.block_manager().num_cached_blocks(), 2) << "the landed prompt's full blocks";
  EXPECT_FALSE(coordinator_.has_pinned());
  expect_consistent();
}

}  // namespace
}  // namespace pdserve
