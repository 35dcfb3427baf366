// The engine's side of the lower KV tiers over a scripted tier store and the fake model (which
// reads every position back through the block table, so a reload that did not land, or a
// block reused while a copy could still write it, shows as a wrong context):
//  * offload holds: a block being copied out is never reused until the copy is polled done;
//  * a landed reload counts as computed and the rest is prefilled, to the oracle's output;
//  * a failed reload, an overdue one (its blocks stay held until the copy ends) and an abort
//    during a reload cost the cache only;
//  * the rule: a reload estimated slower than recomputing is declined.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "common/engine/block_hash.h"
#include "common/engine/kv_tier_coordinator.h"
#include "engine_test_util.h"
#include "fake_model_runner.h"
#include "scripted_tier_store.h"

namespace pdserve {
namespace {

using testing::expected_output;
using testing::FakeModelRunner;
using testing::greedy_params;
using testing::iota_tokens;
using testing::kTestEos;
using testing::kTestVocab;
using testing::run_step;
using testing::ScriptedTierStore;

constexpr int kBlocks = 8;
constexpr int kBlockSize = 4;

Scheduler make_scheduler() {
  SchedulerConfig config;
  config.num_blocks = kBlocks;
  config.block_size = kBlockSize;
  config.max_num_batched_tokens = 64;
  config.max_num_seqs = 4;
  config.vocab_size = kTestVocab;
  config.eos_token_ids = {kTestEos};
  return Scheduler::create(config).value();
}

// The chained keys of `prompt`'s first `blocks` blocks.
std::vector<uint64_t> keys_of(const std::vector<int32_t>& prompt, int blocks) {
  std::vector<uint64_t> keys;
  uint64_t parent = kRootBlockHash;
  for (int i = 0; i < blocks; ++i) {
    parent = hash_block_tokens(parent, std::span(prompt).subspan(i * kBlockSize, kBlockSize));
    keys.push_back(parent);
  }
  return keys;
}

std::vector<int32_t> table_of(const Scheduler& scheduler, SeqId seq_id) {
  const std::span<const int32_t> table = scheduler.block_manager().block_table(seq_id);
  return {table.begin(), table.end()};
}

class KvTierCoordinatorTest : public ::testing::Test {
 protected:
  KvTierCoordinatorTest()
      : scheduler_(make_scheduler()), runner_(kBlocks, kBlockSize, kTestVocab) {}

  KvTierPolicy always() {
    KvTierPolicy policy;
    policy.reload = KvTierPolicy::Reload::kAlways;
    return policy;
  }
  // Reloads every tier hit and is past its deadline at the first look.
  KvTierPolicy always_overdue() {
    KvTierPolicy policy = always();
    policy.min_deadline = std::chrono::milliseconds(0);
    policy.deadline_factor = 0;
    return policy;
  }
  // The greedy output of prompt_ for 3 tokens, from the reference (no tiers involved).
  std::vector<int32_t> oracle_of_3_tokens() const {
    return expected_output(prompt_, greedy_params(3), std::vector<int32_t>{kTestEos}, kTestVocab);
  }
  // Runs `seq_id` to its end (stepping the coordinator first each step); its output.
  std::vector<int32_t> run_to_end(KvTierCoordinator& tiers, SeqId seq_id) {
    std::vector<int32_t> output;
    for (int step = 0; step < 100 && scheduler_.find(seq_id) != nullptr; ++step) {
      tiers.step_begin();
      for (const SequenceUpdate& update : run_step(scheduler_, runner_).updates) {
        if (update.seq_id == seq_id) output.push_back(update.token);
      }
    }
    return output;
  }
  void expect_consistent() {
    const Status invariants = scheduler_.block_manager().check_invariants();
    EXPECT_TRUE(invariants.ok()) << invariants.to_string();
  }

  const std::vector<int32_t> prompt_ = iota_tokens(13, 5);  // 3 whole blocks before the last
  Scheduler scheduler_;
  FakeModelRunner runner_;
  ScriptedTierStore store_;
};

TEST_F(KvTierCoordinatorTest, ABlockIsNotReusedWhileItsOffloadRuns) {
  KvTierCoordinator tiers(&store_, scheduler_, always());
  const SeqId first = scheduler_.add_request(prompt_, greedy_params(2)).value();
  run_to_end(tiers, first);
  tiers.step_begin();  // the finished sequence's 3 full blocks are held for their offload
  ASSERT_EQ(store_.offloads.size(), 1u);
  const TierJobId job = store_.offloads.begin()->first;
  EXPECT_EQ(store_.offloads.at(job).size(), 3u);
  EXPECT_EQ(scheduler_.block_manager().num_cached_blocks(), 0);
  // A prompt needing the whole pool waits for them.
  const SeqId big = scheduler_.add_request(iota_tokens(30, 20), greedy_params(1)).value();
  EXPECT_TRUE(run_step(scheduler_, runner_).entries.empty());
  store_.finish(job);
  tiers.step_begin();
  EXPECT_EQ(scheduler_.block_manager().num_cached_blocks(), 3);
  run_to_end(tiers, big);
  expect_consistent();
}

TEST_F(KvTierCoordinatorTest, ALandedReloadCountsAsComputedAndTheRestIsPrefilled) {
  KvTierCoordinator tiers(&store_, scheduler_, always());
  for (uint64_t key : keys_of(prompt_, 3)) store_.keys.insert(key);
  const std::vector<int32_t> oracle =
      expected_output(prompt_, greedy_params(4), std::vector<int32_t>{kTestEos}, kTestVocab);
  const SeqId seq = scheduler_.add_request(prompt_, greedy_params(4)).value();
  EXPECT_TRUE(run_step(scheduler_, runner_).entries.empty());  // admitted, loading
  EXPECT_EQ(scheduler_.find(seq)->status(), SequenceStatus::kLoadingKv);
  EXPECT_EQ(scheduler_.num_loading(), 1);
  ASSERT_EQ(store_.reloads.size(), 1u);
  const auto& [job, reloads] = *store_.reloads.begin();
  ASSERT_EQ(reloads.size(), 3u);
  EXPECT_EQ(reloads[0].pool_block, table_of(scheduler_, seq)[0]);
  runner_.write_remote_kv(std::span(prompt_).first(12), table_of(scheduler_, seq), 0);
  store_.finish(job);
  const std::vector<FinishedReload> finished = tiers.step_begin();
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0].timing.tokens, 12);
  const auto trace = run_step(scheduler_, runner_);
  ASSERT_EQ(trace.entries.size(), 1u);
  EXPECT_EQ(trace.entries[0].num_cached_before, 12);
  EXPECT_EQ(trace.entries[0].num_new_tokens, 1);
  std::vector<int32_t> output = {trace.updates.at(0).token};
  for (int32_t token : run_to_end(tiers, seq)) output.push_back(token);
  EXPECT_EQ(output, oracle);
  expect_consistent();
}

TEST_F(KvTierCoordinatorTest, AFailedReloadIsComputedInstead) {
  KvTierCoordinator tiers(&store_, scheduler_, always());
  for (uint64_t key : keys_of(prompt_, 3)) store_.keys.insert(key);
  const std::vector<int32_t> oracle = oracle_of_3_tokens();
  const SeqId seq = scheduler_.add_request(prompt_, greedy_params(3)).value();
  run_step(scheduler_, runner_);
  store_.finish(store_.reloads.begin()->first, data_loss("checksum"));
  const std::vector<FinishedReload> finished = tiers.step_begin();
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_FALSE(finished[0].timing.ok);
  const auto trace = run_step(scheduler_, runner_);
  EXPECT_EQ(trace.entries.at(0).num_cached_before, 0);
  std::vector<int32_t> output = {trace.updates.at(0).token};
  for (int32_t token : run_to_end(tiers, seq)) output.push_back(token);
  EXPECT_EQ(output, oracle);
  ServiceStats stats;
  tiers.fill_stats(stats);
  EXPECT_EQ(stats.kv_tiers.reloads_failed_total, 1);
  expect_consistent();
}

TEST_F(KvTierCoordinatorTest, AnOverdueReloadRestartsWithFreshBlocksAndTheOldOnesStayHeld) {
  KvTierCoordinator tiers(&store_, scheduler_, always_overdue());
  for (uint64_t key : keys_of(prompt_, 3)) store_.keys.insert(key);
  const std::vector<int32_t> oracle = oracle_of_3_tokens();
  const SeqId seq = scheduler_.add_request(prompt_, greedy_params(3)).value();
  run_step(scheduler_, runner_);
  const std::vector<int32_t> old_table = table_of(scheduler_, seq);
  tiers.step_begin();  // past its deadline: back to the queue, its old blocks held
  EXPECT_EQ(scheduler_.find(seq)->status(), SequenceStatus::kWaiting);
  const auto trace = run_step(scheduler_, runner_);  // computed in full, no second reload
  EXPECT_EQ(store_.reloads.size(), 1u);
  EXPECT_EQ(trace.entries.at(0).num_cached_before, 0);
  for (int32_t block : table_of(scheduler_, seq)) {
    EXPECT_EQ(std::ranges::count(old_table, block), 0) << "block " << block << " reused";
  }
  std::vector<int32_t> output = {trace.updates.at(0).token};
  // The late copy lands while the sequence decodes: its blocks go back only now.
  store_.finish(store_.reloads.begin()->first);
  for (int32_t token : run_to_end(tiers, seq)) output.push_back(token);
  EXPECT_EQ(output, oracle);
  EXPECT_EQ(scheduler_.block_manager().num_used_blocks(), 0);
  expect_consistent();
}

TEST_F(KvTierCoordinatorTest, AnAbortDuringAReloadFreesTheBlocksOnlyWhenTheCopyEnds) {
  KvTierCoordinator tiers(&store_, scheduler_, always());
  for (uint64_t key : keys_of(prompt_, 3)) store_.keys.insert(key);
  const SeqId seq = scheduler_.add_request(prompt_, greedy_params(3)).value();
  run_step(scheduler_, runner_);
  ASSERT_TRUE(scheduler_.abort(seq).ok());
  EXPECT_FALSE(scheduler_.has_unfinished());
  EXPECT_EQ(scheduler_.block_manager().num_used_blocks(), 4);  // pinned for the copy
  store_.finish(store_.reloads.begin()->first);
  EXPECT_TRUE(tiers.step_begin().empty());
  EXPECT_EQ(scheduler_.block_manager().num_used_blocks(), 0);
  expect_consistent();
}

TEST_F(KvTierCoordinatorTest, TheRuleReloadsOnlyWhatIsFasterThanRecomputing) {
  KvTierPolicy policy;
  policy.prior_host_bytes_per_second = 1000;  // 1 s per 1000-byte block
  policy.prior_disk_bytes_per_second = 100;
  KvTierCoordinator tiers(&store_, scheduler_, policy);
  EXPECT_TRUE(tiers.reload_is_faster(1, 0));  // no prefill measured yet
  tiers.note_prefill(400, 1.0);               // 400 tokens/s: a 4-token block in 10 ms
  EXPECT_FALSE(tiers.reload_is_faster(1, 0));
  tiers.note_prefill(1, 1.0);  // the mean falls towards 1 token/s (EWMA)
  for (int i = 0; i < 40; ++i) tiers.note_prefill(1, 1.0);
  EXPECT_TRUE(tiers.reload_is_faster(1, 0));   // 1 s < 4 s
  EXPECT_FALSE(tiers.reload_is_faster(0, 1));  // 10 s > 4 s

  for (uint64_t key : keys_of(prompt_, 3)) store_.keys.insert(key);
  tiers.note_prefill(1'000'000, 1.0);
  for (int i = 0; i < 40; ++i) tiers.note_prefill(1'000'000, 1.0);
  const SeqId seq = scheduler_.add_request(prompt_, greedy_params(2)).value();
  EXPECT_EQ(run_step(scheduler_, runner_).entries.at(0).num_cached_before, 0);
  EXPECT_TRUE(store_.reloads.empty());
  ServiceStats stats;
  tiers.fill_stats(stats);
  EXPECT_EQ(stats.kv_tiers.reloads_declined_total, 1);
  run_to_end(tiers, seq);
}

TEST_F(KvTierCoordinatorTest, ADecodeNodeReloadsItsTierHitBeforeAskingForTheRest) {
  KvTierCoordinator tiers(&store_, scheduler_, always());
  for (uint64_t key : keys_of(prompt_, 2)) store_.keys.insert(key);
  const SeqId seq = scheduler_.add_imported_request(prompt_, greedy_params(3)).value();
  ASSERT_TRUE(tiers.start_import_load(*scheduler_.find(seq), table_of(scheduler_, seq)));
  EXPECT_EQ(scheduler_.find(seq)->status(), SequenceStatus::kAwaitingKv);
  store_.finish(store_.reloads.begin()->first);
  const std::vector<FinishedReload> finished = tiers.step_begin();
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_TRUE(finished[0].for_import);
  EXPECT_FALSE(finished[0].given_up);
  // What the import now asks of the prefill node: from token 8 on.
  EXPECT_EQ(scheduler_.find(seq)->num_computed_tokens(), 8);
  EXPECT_EQ(scheduler_.find(seq)->status(), SequenceStatus::kAwaitingKv);
  ASSERT_TRUE(scheduler_.abort(seq).ok());
  EXPECT_EQ(scheduler_.block_manager().num_used_blocks(), 0);
  expect_consistent();
}

TEST_F(KvTierCoordinatorTest, AnOverdueReloadBeforeAnImportFallsBackToALocalPrefill) {
  KvTierCoordinator tiers(&store_, scheduler_, always_overdue());
  for (uint64_t key : keys_of(prompt_, 3)) store_.keys.insert(key);
  const std::vector<int32_t> oracle = oracle_of_3_tokens();
  const SeqId seq = scheduler_.add_imported_request(prompt_, greedy_params(3)).value();
  ASSERT_TRUE(tiers.start_import_load(*scheduler_.find(seq), table_of(scheduler_, seq)));
  const std::vector<FinishedReload> finished = tiers.step_begin();
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_TRUE(finished[0].given_up);
  EXPECT_EQ(scheduler_.find(seq)->status(), SequenceStatus::kWaiting);
  const auto trace = run_step(scheduler_, runner_);
  EXPECT_EQ(trace.entries.at(0).num_cached_before, 0);
  std::vector<int32_t> output = {trace.updates.at(0).token};
  store_.finish(store_.reloads.begin()->first);
  for (int32_t token : run_to_end(tiers, seq)) output.push_back(token);
  EXPECT_EQ(output, oracle);
  EXPECT_EQ(scheduler_.block_manager().num_used_blocks(), 0);
  expect_consistent();
}

}  // namespace
}  // namespace pdserve
