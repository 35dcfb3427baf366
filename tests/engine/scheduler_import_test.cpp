// The scheduler's import path (decode side of disaggregation): a remotely prefilled sequence
// holds its blocks while awaiting KV, takes its first token before the KV lands, joins the
// decode batch once it has, and decodes to exactly what the same prompt gives when prefilled
// locally (the fake model's oracle reads every position back through the block table). When
// the remote prefill fails, the sequence is prefilled here with fresh blocks while the old ones
// stay held for the transfer, and still decodes to the oracle's output.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "common/engine/scheduler.h"
#include "engine_test_util.h"
#include "fake_model_runner.h"

namespace pdserve {
namespace {

using testing::expected_output;
using testing::fake_next_token;
using testing::FakeModelRunner;
using testing::greedy_params;
using testing::iota_tokens;
using testing::kTestEos;
using testing::kTestVocab;
using testing::run_step;

constexpr int kBlocks = 16;
constexpr int kBlockSize = 4;

Scheduler make_scheduler(int max_num_seqs = 8) {
  SchedulerConfig config;
  config.num_blocks = kBlocks;
  config.block_size = kBlockSize;
  config.max_num_batched_tokens = 16;
  config.max_num_seqs = max_num_seqs;
  config.max_num_waiting = 16;
  config.vocab_size = kTestVocab;
  config.eos_token_ids = {kTestEos};
  Result<Scheduler> scheduler = Scheduler::create(config);
  EXPECT_TRUE(scheduler.ok()) << scheduler.status().to_string();
  return std::move(scheduler).value();
}

SeqId add_imported(Scheduler& scheduler, const std::vector<int32_t>& prompt, int max_tokens,
                   bool ignore_eos = true) {
  Result<SeqId> id = scheduler.add_imported_request(prompt, greedy_params(max_tokens, ignore_eos));
  EXPECT_TRUE(id.ok()) << id.status().to_string();
  return id.ok() ? *id : -1;
}

// How many of `prompt`'s tokens a new import of it finds in the prefix cache.
int cached_tokens_of(Scheduler& scheduler, const std::vector<int32_t>& prompt) {
  const SeqId again = add_imported(scheduler, prompt, 1);
  return scheduler.find(again)->num_computed_tokens();
}

// What greedy sampling gives for `prompt` (the fake model's oracle).
std::vector<int32_t> greedy_oracle(const std::vector<int32_t>& prompt, int max_tokens) {
  return expected_output(prompt, greedy_params(max_tokens), std::vector<int32_t>{kTestEos},
                         kTestVocab);
}

std::vector<int32_t> table_of(const Scheduler& scheduler, SeqId seq_id) {
  const std::span<const int32_t> table = scheduler.block_manager().block_table(seq_id);
  return {table.begin(), table.end()};
}

void expect_nothing_held(const Scheduler& scheduler) {
  EXPECT_FALSE(scheduler.has_unfinished());
  EXPECT_EQ(scheduler.num_awaiting_kv(), 0);
  EXPECT_EQ(scheduler.block_manager().num_used_blocks(), 0);
  const Status invariants = scheduler.block_manager().check_invariants();
  EXPECT_TRUE(invariants.ok()) << invariants.to_string();
}

TEST(SchedulerImportTest, FirstTokenComesBeforeTheKvAndDecodingMatchesALocalPrefill) {
  Scheduler scheduler = make_scheduler();
  FakeModelRunner runner(kBlocks, kBlockSize, kTestVocab);
  const std::vector<int32_t> prompt = iota_tokens(10, 3);
  constexpr int kMaxTokens = 6;
  const std::vector<int32_t> oracle = greedy_oracle(prompt, kMaxTokens);
  const SeqId local = scheduler.add_request(iota_tokens(5, 40), greedy_params(20)).value();
  const SeqId imported = add_imported(scheduler, prompt, kMaxTokens);

  const Sequence& seq = *scheduler.find(imported);
  EXPECT_EQ(seq.status(), SequenceStatus::kAwaitingKv);
  EXPECT_EQ(seq.num_computed_tokens(), 0);
  EXPECT_EQ(scheduler.num_awaiting_kv(), 1);
  EXPECT_EQ(table_of(scheduler, imported).size(), 3u);  // blocks for the 10 prompt tokens

  // Awaiting KV, the sequence is never scheduled, with or without its first token.
  for (int i = 0; i < 2; ++i) {
    for (const auto& entry : run_step(scheduler, runner).entries) EXPECT_EQ(entry.seq_id, local);
  }
  // The KV is not there yet: it cannot join the batch before its first token either.
  EXPECT_EQ(scheduler.complete_import(imported).code(), StatusCode::kFailedPrecondition);

  Result<SequenceUpdate> first = scheduler.accept_remote_first_token(imported, oracle[0]);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(first->seq_id, imported);
  EXPECT_EQ(first->token, oracle[0]);
  EXPECT_EQ(first->finish_reason, FinishReason::kNone);
  EXPECT_EQ(seq.status(), SequenceStatus::kAwaitingKv);
  EXPECT_EQ(seq.num_output_tokens(), 1);
  EXPECT_EQ(seq.num_computed_tokens(), 0);
  EXPECT_EQ(scheduler.accept_remote_first_token(imported, oracle[0]).status().code(),
            StatusCode::kFailedPrecondition);
  for (const auto& entry : run_step(scheduler, runner).entries) EXPECT_EQ(entry.seq_id, local);

  runner.write_remote_kv(prompt, table_of(scheduler, imported), 0);
  ASSERT_TRUE(scheduler.complete_import(imported).ok());
  EXPECT_EQ(seq.status(), SequenceStatus::kRunning);
  EXPECT_EQ(seq.num_computed_tokens(), static_cast<int>(prompt.size()));
  EXPECT_EQ(scheduler.num_awaiting_kv(), 0);
  EXPECT_EQ(scheduler.complete_import(imported).code(), StatusCode::kFailedPrecondition);
  std::vector<int32_t> output = {first->token};
  while (scheduler.find(imported) != nullptr) {
    const auto trace = run_step(scheduler, runner);
    for (const auto& entry : trace.entries) {
      if (entry.seq_id == imported) {
        EXPECT_EQ(entry.num_new_tokens, 1) << "an imported sequence only decodes";
      }
    }
    for (const SequenceUpdate& update : trace.updates) {
      if (update.seq_id == imported) output.push_back(update.token);
    }
  }
  EXPECT_EQ(output, oracle);
  ASSERT_TRUE(scheduler.abort(local).ok());
  expect_nothing_held(scheduler);
  // Landed KV enters the prefix cache: the same prompt again finds its two full blocks.
  EXPECT_EQ(cached_tokens_of(scheduler, prompt), 8);
}

TEST(SchedulerImportTest, AnImportReusesTheLocalPrefixCacheAndReceivesOnlyTheRest) {
  Scheduler scheduler = make_scheduler();
  FakeModelRunner runner(kBlocks, kBlockSize, kTestVocab);
  const std::vector<int32_t> system = iota_tokens(8, 20);
  std::vector<int32_t> prompt = system;
  prompt.insert(prompt.end(), {50, 51, 52});
  ASSERT_TRUE(scheduler.add_request(system, greedy_params(1)).ok());
  while (scheduler.has_unfinished()) run_step(scheduler, runner);

  const SeqId imported = add_imported(scheduler, prompt, 4);
  EXPECT_EQ(scheduler.find(imported)->num_computed_tokens(), 8);  // two cached blocks
  const std::vector<int32_t> oracle = greedy_oracle(prompt, 4);
  ASSERT_TRUE(scheduler.accept_remote_first_token(imported, oracle[0]).ok());
  runner.write_remote_kv(prompt, table_of(scheduler, imported), 8);
  ASSERT_TRUE(scheduler.complete_import(imported).ok());
  std::vector<int32_t> output = {oracle[0]};
  while (scheduler.has_unfinished()) {
    for (const SequenceUpdate& update : run_step(scheduler, runner).updates) {
      output.push_back(update.token);
    }
  }
  EXPECT_EQ(output, oracle);
  expect_nothing_held(scheduler);
}

TEST(SchedulerImportTest, ABadFirstTokenChangesNothing) {
  Scheduler scheduler = make_scheduler();
  const SeqId imported = add_imported(scheduler, iota_tokens(6), 4);
  EXPECT_EQ(scheduler.accept_remote_first_token(imported, kTestVocab).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.accept_remote_first_token(imported, -1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.accept_remote_first_token(12345, 1).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(scheduler.complete_import(12345).code(), StatusCode::kFailedPrecondition);
  const Sequence& seq = *scheduler.find(imported);
  EXPECT_EQ(seq.num_output_tokens(), 0);
  EXPECT_EQ(seq.status(), SequenceStatus::kAwaitingKv);
  EXPECT_EQ(scheduler.num_awaiting_kv(), 1);
  ASSERT_TRUE(scheduler.accept_remote_first_token(imported, 7).ok());
  ASSERT_TRUE(scheduler.abort(imported).ok());
  expect_nothing_held(scheduler);
}

TEST(SchedulerImportTest, AFirstTokenThatFinishesStillWaitsForTheKvToCacheIt) {
  for (const bool by_eos : {false, true}) {
    SCOPED_TRACE(by_eos ? "EOS" : "max_tokens 1");
    Scheduler scheduler = make_scheduler();
    FakeModelRunner runner(kBlocks, kBlockSize, kTestVocab);
    const std::vector<int32_t> prompt = iota_tokens(9);
    const SeqId imported = add_imported(scheduler, prompt, by_eos ? 5 : 1, /*ignore_eos=*/!by_eos);
    ASSERT_TRUE(scheduler.block_manager().pin(imported).ok());  // the transfer's pin
    Result<SequenceUpdate> first =
        scheduler.accept_remote_first_token(imported, by_eos ? kTestEos : 5);
    ASSERT_TRUE(first.ok()) << first.status().to_string();
    EXPECT_EQ(first->finish_reason, by_eos ? FinishReason::kStop : FinishReason::kLength);
    // Finished for the client, but its blocks wait for the KV; nothing schedules it.
    const Sequence& seq = *scheduler.find(imported);
    EXPECT_EQ(seq.status(), SequenceStatus::kAwaitingKv);
    EXPECT_EQ(scheduler.num_awaiting_kv(), 1);
    EXPECT_FALSE(scheduler.has_schedulable());
    EXPECT_EQ(scheduler.accept_remote_first_token(imported, 5).status().code(),
              StatusCode::kFailedPrecondition);

    runner.write_remote_kv(prompt, table_of(scheduler, imported), 0);
    ASSERT_TRUE(scheduler.complete_import(imported).ok());
    EXPECT_EQ(scheduler.find(imported), nullptr);
    EXPECT_EQ(scheduler.abort(imported).code(), StatusCode::kNotFound);
    // A put may still be in flight until the transfer unpins.
    EXPECT_EQ(scheduler.block_manager().num_used_blocks(), 3);
    ASSERT_TRUE(scheduler.block_manager().unpin(imported).ok());
    expect_nothing_held(scheduler);
    // The landed prompt serves the next request with the same prefix.
    EXPECT_EQ(cached_tokens_of(scheduler, prompt), 8);
  }
}

TEST(SchedulerImportTest, AFinishedImportWhoseKvNeverLandsCachesNothing) {
  Scheduler scheduler = make_scheduler();
  const std::vector<int32_t> prompt = iota_tokens(9);
  const SeqId imported = add_imported(scheduler, prompt, 1);
  ASSERT_TRUE(scheduler.accept_remote_first_token(imported, 5).ok());
  ASSERT_TRUE(scheduler.abort(imported).ok());  // the transfer failed
  expect_nothing_held(scheduler);
  EXPECT_EQ(scheduler.block_manager().num_cached_blocks(), 0);
  EXPECT_EQ(cached_tokens_of(scheduler, prompt), 0);
}

TEST(SchedulerImportTest, AbortInEveryStateOfAnImport) {
  Scheduler scheduler = make_scheduler();
  FakeModelRunner runner(kBlocks, kBlockSize, kTestVocab);
  const std::vector<int32_t> prompt = iota_tokens(5, 9);
  const SeqId before_first = add_imported(scheduler, prompt, 8);
  const SeqId after_first = add_imported(scheduler, prompt, 8);
  const SeqId decoding = add_imported(scheduler, prompt, 8);
  const SeqId in_step = add_imported(scheduler, prompt, 8);
  for (SeqId id : {after_first, decoding, in_step}) {
    ASSERT_TRUE(scheduler.accept_remote_first_token(id, 1).ok());
  }
  for (SeqId id : {decoding, in_step}) {
    runner.write_remote_kv(prompt, table_of(scheduler, id), 0);
    ASSERT_TRUE(scheduler.complete_import(id).ok());
  }
  run_step(scheduler, runner);
  EXPECT_EQ(scheduler.num_awaiting_kv(), 2);
  EXPECT_EQ(scheduler.num_running(), 2);

  ASSERT_TRUE(scheduler.abort(before_first).ok());
  ASSERT_TRUE(scheduler.abort(after_first).ok());
  EXPECT_EQ(scheduler.num_awaiting_kv(), 0);
  EXPECT_EQ(scheduler.accept_remote_first_token(before_first, 1).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(scheduler.complete_import(after_first).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(scheduler.abort(decoding).ok());
  // Mid-step: the blocks go at postprocess(), after the runner is done with them.
  const ScheduledBatch batch = scheduler.schedule();
  ASSERT_EQ(batch.entries.size(), 1u);
  const std::vector<int32_t> sampled = runner.run(batch, scheduler.block_manager());
  ASSERT_TRUE(scheduler.abort(in_step).ok());
  EXPECT_TRUE(scheduler.block_manager().has_table(in_step));
  ASSERT_TRUE(scheduler.postprocess(batch, sampled).ok());
  for (SeqId id : {before_first, after_first, decoding, in_step}) {
    EXPECT_EQ(scheduler.abort(id).code(), StatusCode::kNotFound);
  }
  expect_nothing_held(scheduler);
}

// Runs steps until `seq_id` is gone; returns the tokens it got and checks that its first
// scheduled entry computes something (a prompt is never taken whole from the cache).
std::vector<int32_t> run_to_end(Scheduler& scheduler, FakeModelRunner& runner, SeqId seq_id) {
  std::vector<int32_t> output;
  bool first_entry = true;
  for (int steps = 0; scheduler.find(seq_id) != nullptr && steps < 100; ++steps) {
    const auto trace = run_step(scheduler, runner);
    for (const auto& entry : trace.entries) {
      if (entry.seq_id != seq_id) continue;
      if (first_entry) {
        EXPECT_GE(entry.num_new_tokens, 1);
      }
      first_entry = false;
    }
    for (const SequenceUpdate& update : trace.updates) {
      if (update.seq_id == seq_id) output.push_back(update.token);
    }
  }
  return output;
}

// Fails an import as the engine does when its KV cannot come: after its remote first token
// (appended to `output`) when there is one, it is requeued to be prefilled here. Returns the
// holder id of the blocks the transfer may still write.
Result<SeqId> requeue_failed_import(Scheduler& scheduler, SeqId imported,
                                    std::optional<int32_t> first_token,
                                    std::vector<int32_t>& output) {
  if (first_token) {
    PDS_RETURN_IF_ERROR(scheduler.accept_remote_first_token(imported, *first_token).status());
    output.push_back(*first_token);
  }
  return scheduler.requeue_failed_import(imported);
}

// Every prefill node failed (before the first token) or the KV failed its checksum (after it):
// the blocks held for the transfer stay used and pinned under the holder id, garbage in them is
// never read, and the sequence, requeued, gets fresh blocks and the oracle's output.
TEST(SchedulerImportTest, AFailedImportIsPrefilledHereWhileTheTransfersBlocksStayHeld) {
  for (const bool with_first_token : {false, true}) {
    SCOPED_TRACE(with_first_token ? "after the first token" : "before the first token");
    Scheduler scheduler = make_scheduler();
    FakeModelRunner runner(kBlocks, kBlockSize, kTestVocab);
    const std::vector<int32_t> prompt = iota_tokens(10, 3);
    constexpr int kMaxTokens = 6;
    const std::vector<int32_t> oracle = greedy_oracle(prompt, kMaxTokens);
    const SeqId imported = add_imported(scheduler, prompt, kMaxTokens);
    ASSERT_TRUE(scheduler.block_manager().pin(imported).ok());  // as the engine does
    const std::vector<int32_t> held = table_of(scheduler, imported);
    // What a corrupted or half-done transfer left there.
    runner.write_remote_kv(iota_tokens(10, 500), held, 0);
    std::vector<int32_t> output;
    Result<SeqId> holder = requeue_failed_import(
        scheduler, imported, with_first_token ? std::optional(oracle[0]) : std::nullopt, output);
    ASSERT_TRUE(holder.ok()) << holder.status().to_string();
    EXPECT_NE(*holder, imported);
    EXPECT_EQ(scheduler.find(*holder), nullptr) << "a holder is no sequence";
    EXPECT_EQ(table_of(scheduler, *holder), held);
    EXPECT_FALSE(scheduler.block_manager().has_table(imported));
    EXPECT_EQ(scheduler.num_awaiting_kv(), 0);
    EXPECT_EQ(scheduler.num_waiting(), 1);
    const Sequence& seq = *scheduler.find(imported);
    EXPECT_EQ(seq.status(), SequenceStatus::kWaiting);
    EXPECT_EQ(seq.num_output_tokens(), with_first_token ? 1 : 0);
    EXPECT_EQ(scheduler.requeue_failed_import(imported).status().code(),
              StatusCode::kFailedPrecondition);

    const auto first_step = run_step(scheduler, runner);
    ASSERT_EQ(first_step.entries.size(), 1u);
    EXPECT_EQ(first_step.entries[0].num_cached_before, 0) << "nothing of it is cached here";
    for (const SequenceUpdate& update : first_step.updates) output.push_back(update.token);
    const std::vector<int32_t> fresh = table_of(scheduler, imported);
    ASSERT_FALSE(fresh.empty());
    for (int32_t block : fresh) {
      const auto in_held = std::count(held.begin(), held.end(), block);
      EXPECT_EQ(in_held, 0) << "block " << block << " is still held for the transfer";
    }
    const std::vector<int32_t> rest = run_to_end(scheduler, runner, imported);
    output.insert(output.end(), rest.begin(), rest.end());
    EXPECT_EQ(output, oracle);

    // Until the transfer lets go, its blocks stay used and nothing enters the cache from them.
    EXPECT_EQ(scheduler.block_manager().num_used_blocks(), static_cast<int>(held.size()));
    ASSERT_TRUE(scheduler.block_manager().unpin(*holder).ok());
    expect_nothing_held(scheduler);
  }
}

// A prompt whose blocks are all in the prefix cache still computes its last token (or, after a
// remote first token, that token) before sampling.
TEST(SchedulerImportTest, AFullyCachedPromptFallingBackStillComputesSomething) {
  for (const bool with_first_token : {false, true}) {
    SCOPED_TRACE(with_first_token ? "after the first token" : "before the first token");
    Scheduler scheduler = make_scheduler();
    FakeModelRunner runner(kBlocks, kBlockSize, kTestVocab);
    const std::vector<int32_t> prompt = iota_tokens(8, 3);  // two full blocks
    const std::vector<int32_t> oracle = greedy_oracle(prompt, 4);
    const SeqId warm = scheduler.add_request(prompt, greedy_params(4)).value();
    EXPECT_EQ(run_to_end(scheduler, runner, warm), oracle);
    const SeqId imported = add_imported(scheduler, prompt, 4);
    std::vector<int32_t> output;
    Result<SeqId> holder = requeue_failed_import(
        scheduler, imported, with_first_token ? std::optional(oracle[0]) : std::nullopt, output);
    ASSERT_TRUE(holder.ok()) << holder.status().to_string();
    const std::vector<int32_t> rest = run_to_end(scheduler, runner, imported);
    output.insert(output.end(), rest.begin(), rest.end());
    EXPECT_EQ(output, oracle);
    expect_nothing_held(scheduler);
  }
}

TEST(SchedulerImportTest, ImportsAreRefusedWhenThePoolOrTheSequenceCapIsFull) {
  Scheduler scheduler = make_scheduler(/*max_num_seqs=*/2);
  const SeqId big = add_imported(scheduler, iota_tokens(48), 8);  // 12 of the 16 blocks
  EXPECT_EQ(scheduler.add_imported_request(iota_tokens(20), greedy_params(4)).status().code(),
            StatusCode::kResourceExhausted);
  const SeqId small = add_imported(scheduler, iota_tokens(4), 4);
  EXPECT_EQ(scheduler.add_imported_request(iota_tokens(2), greedy_params(1)).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(scheduler.num_awaiting_kv(), 2);
  ASSERT_TRUE(scheduler.abort(big).ok());
  ASSERT_TRUE(scheduler.abort(small).ok());
  expect_nothing_held(scheduler);
}

}  // namespace
}  // namespace pdserve
