#include "common/engine/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "engine_test_util.h"
#include "fake_model_runner.h"

namespace pdserve {
namespace {

using testing::expected_output;
using testing::FakeModelRunner;
using testing::greedy_params;
using testing::iota_tokens;
using testing::kTestEos;
using testing::kTestVocab;
using testing::run_step;
using testing::StepTrace;

SchedulerConfig small_config(int num_blocks, int block_size, int max_num_batched_tokens) {
  SchedulerConfig config;
  config.num_blocks = num_blocks;
  config.block_size = block_size;
  config.max_num_batched_tokens = max_num_batched_tokens;
  config.max_num_seqs = 8;
  config.max_num_waiting = 16;
  config.vocab_size = kTestVocab;
  config.eos_token_ids = {kTestEos};
  return config;
}

Scheduler make_scheduler(const SchedulerConfig& config) {
  Result<Scheduler> scheduler = Scheduler::create(config);
  EXPECT_TRUE(scheduler.ok()) << scheduler.status().to_string();
  return std::move(scheduler).value();
}

SeqId add(Scheduler& scheduler, std::vector<int32_t> prompt, int max_tokens) {
  Result<SeqId> id = scheduler.add_request(std::move(prompt), greedy_params(max_tokens));
  EXPECT_TRUE(id.ok()) << id.status().to_string();
  return id.ok() ? *id : -1;
}

// Runs until idle, collecting each sequence's tokens.
std::map<SeqId, std::vector<int32_t>> run_to_completion(Scheduler& scheduler,
                                                        FakeModelRunner& runner) {
  std::map<SeqId, std::vector<int32_t>> outputs;
  for (int step = 0; scheduler.has_unfinished() && step < 10000; ++step) {
    for (const SequenceUpdate& update : run_step(scheduler, runner).updates) {
      outputs[update.seq_id].push_back(update.token);
    }
  }
  EXPECT_FALSE(scheduler.has_unfinished());
  return outputs;
}

void expect_nothing_held(const Scheduler& scheduler) {
  const BlockManager& blocks = scheduler.block_manager();
  EXPECT_EQ(blocks.num_used_blocks(), 0);
  EXPECT_EQ(blocks.num_free_blocks() + blocks.num_cached_blocks(), blocks.num_blocks());
  const Status invariants = blocks.check_invariants();
  EXPECT_TRUE(invariants.ok()) << invariants.to_string();
}

std::vector<int32_t> expected(const std::vector<int32_t>& prompt, int max_tokens) {
  const int32_t eos[] = {kTestEos};
  return expected_output(prompt, greedy_params(max_tokens), eos, kTestVocab);
}

TEST(SchedulerTest, RejectsBadConfigs) {
  SchedulerConfig config = small_config(8, 4, 16);
  config.max_num_seqs = 0;
  EXPECT_EQ(Scheduler::create(config).status().code(), StatusCode::kInvalidArgument);
  config = small_config(8, 4, 0);
  EXPECT_EQ(Scheduler::create(config).status().code(), StatusCode::kInvalidArgument);
  config = small_config(8, 4, 16);
  config.eos_token_ids = {kTestVocab};
  EXPECT_EQ(Scheduler::create(config).status().code(), StatusCode::kInvalidArgument);
  config = small_config(8, 4, 16);
  config.max_model_len = -1;
  EXPECT_EQ(Scheduler::create(config).status().code(), StatusCode::kInvalidArgument);
}

TEST(SchedulerTest, RejectsRequestsThatCanNeverRunAndAFullQueue) {
  SchedulerConfig config = small_config(4, 4, 16);
  config.max_num_waiting = 2;
  config.max_model_len = 20;
  Scheduler scheduler = make_scheduler(config);
  EXPECT_EQ(scheduler.add_request({}, greedy_params(4)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.add_request({1, kTestVocab}, greedy_params(4)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.add_request({1, -1}, greedy_params(4)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.add_request({1}, greedy_params(0)).status().code(),
            StatusCode::kInvalidArgument);
  // 10 + 11 > max_model_len 20.
  EXPECT_EQ(scheduler.add_request(iota_tokens(10), greedy_params(11)).status().code(),
            StatusCode::kOutOfRange);
  config.max_model_len = 0;
  Scheduler pool_bound = make_scheduler(config);
  // 10 + 7 - 1 = 16 tokens of KV fill the 4 blocks of 4 exactly; one more never fits.
  EXPECT_TRUE(pool_bound.add_request(iota_tokens(10), greedy_params(7)).ok());
  EXPECT_EQ(pool_bound.add_request(iota_tokens(10), greedy_params(8)).status().code(),
            StatusCode::kOutOfRange);

  EXPECT_EQ(add(scheduler, {1, 2}, 2), 0);
  EXPECT_EQ(add(scheduler, {3, 4}, 2), 1);
  Result<SeqId> full = scheduler.add_request({5}, greedy_params(2));
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("queue is full"), std::string::npos);
  // Admission makes room again.
  FakeModelRunner runner(config.num_blocks, config.block_size, kTestVocab);
  run_step(scheduler, runner);
  EXPECT_EQ(scheduler.num_waiting(), 0);
  EXPECT_EQ(add(scheduler, {5}, 2), 2);
}

TEST(SchedulerTest, ChunksALongPromptAndKeepsItsBlocks) {
  Scheduler scheduler = make_scheduler(small_config(8, 4, 4));
  FakeModelRunner runner(8, 4, kTestVocab);
  const std::vector<int32_t> prompt = iota_tokens(10);
  const SeqId id = add(scheduler, prompt, 3);

  const int expected_cached[] = {0, 4, 8};
  const int expected_new[] = {4, 4, 2};
  for (int step = 0; step < 3; ++step) {
    StepTrace trace = run_step(scheduler, runner);
    ASSERT_EQ(trace.entries.size(), 1u);
    EXPECT_EQ(trace.entries[0].num_cached_before, expected_cached[step]);
    EXPECT_EQ(trace.entries[0].num_new_tokens, expected_new[step]);
    EXPECT_EQ(trace.entries[0].samples, step == 2);
    EXPECT_EQ(trace.num_decodes, 0);
    EXPECT_EQ(trace.updates.size(), step == 2 ? 1u : 0u);
    EXPECT_EQ(scheduler.block_manager().num_used_blocks(), 3);
  }
  const std::map<SeqId, std::vector<int32_t>> outputs = run_to_completion(scheduler, runner);
  std::vector<int32_t> output = expected(prompt, 3);
  output.erase(output.begin());  // sampled at the third step, above
  EXPECT_EQ(outputs.at(id), output);
  expect_nothing_held(scheduler);
}

TEST(SchedulerTest, SchedulesDecodesBeforePrefillChunks) {
  Scheduler scheduler = make_scheduler(small_config(16, 4, 4));
  FakeModelRunner runner(16, 4, kTestVocab);
  const SeqId first = add(scheduler, {1, 2, 3}, 10);
  run_step(scheduler, runner);
  const SeqId second = add(scheduler, iota_tokens(10, 20), 4);
  const SeqId third = add(scheduler, iota_tokens(5, 40), 4);

  StepTrace trace = run_step(scheduler, runner);
  ASSERT_EQ(trace.entries.size(), 2u);
  EXPECT_EQ(trace.num_decodes, 1);
  EXPECT_EQ(trace.entries[0].seq_id, first);
  EXPECT_EQ(trace.entries[0].num_new_tokens, 1);
  EXPECT_EQ(trace.entries[1].seq_id, second);
  EXPECT_EQ(trace.entries[1].num_new_tokens, 3);
  EXPECT_EQ(trace.num_batched_tokens, 4);
  // The third request waits behind the second (FCFS) and is not even admitted.
  EXPECT_EQ(scheduler.find(third)->status(), SequenceStatus::kWaiting);
  EXPECT_FALSE(scheduler.block_manager().has_table(third));

  trace = run_step(scheduler, runner);
  ASSERT_EQ(trace.entries.size(), 2u);
  EXPECT_EQ(trace.entries[0].seq_id, first);
  EXPECT_EQ(trace.entries[1].seq_id, second);
  EXPECT_EQ(trace.entries[1].num_cached_before, 3);
  EXPECT_EQ(trace.entries[1].num_new_tokens, 3);
}

TEST(SchedulerTest, CapsTheNumberOfSequences) {
  SchedulerConfig config = small_config(32, 4, 64);
  config.max_num_seqs = 2;
  Scheduler scheduler = make_scheduler(config);
  FakeModelRunner runner(32, 4, kTestVocab);
  std::vector<std::vector<int32_t>> prompts = {{1, 2}, {3, 4}, {5, 6}};
  for (const auto& prompt : prompts) add(scheduler, prompt, 3);
  StepTrace trace = run_step(scheduler, runner);
  EXPECT_EQ(trace.entries.size(), 2u);
  EXPECT_EQ(scheduler.num_running(), 2);
  EXPECT_EQ(scheduler.num_waiting(), 1);
  const std::map<SeqId, std::vector<int32_t>> outputs = run_to_completion(scheduler, runner);
  EXPECT_EQ(outputs.at(2), expected(prompts[2], 3));
  expect_nothing_held(scheduler);
}

TEST(SchedulerTest, PreemptsTheLatestArrivalAndRecomputesItToTheSameOutput) {
  // Two sequences of 3 prompt tokens fill the 4 blocks of 2 after one decode each.
  Scheduler scheduler = make_scheduler(small_config(4, 2, 64));
  FakeModelRunner runner(4, 2, kTestVocab);
  const std::vector<int32_t> prompt_a = {1, 2, 3};
  const std::vector<int32_t> prompt_b = {4, 5, 6};
  const SeqId a = add(scheduler, prompt_a, 6);
  const SeqId b = add(scheduler, prompt_b, 6);
  std::map<SeqId, std::vector<int32_t>> outputs;
  auto collect = [&](const StepTrace& trace) {
    for (const SequenceUpdate& update : trace.updates) {
      outputs[update.seq_id].push_back(update.token);
    }
  };
  collect(run_step(scheduler, runner));  // both prefill (2 blocks each) and sample
  collect(run_step(scheduler, runner));  // both decode into their second block
  StepTrace trace = run_step(scheduler, runner);
  collect(trace);
  ASSERT_EQ(trace.preempted, std::vector<SeqId>{b});
  ASSERT_EQ(trace.entries.size(), 1u);
  EXPECT_EQ(trace.entries[0].seq_id, a);
  EXPECT_EQ(scheduler.find(b)->status(), SequenceStatus::kPreempted);
  EXPECT_EQ(scheduler.find(b)->num_computed_tokens(), 0);
  EXPECT_EQ(scheduler.find(b)->num_output_tokens(), 2);  // kept: recomputed, not resampled

  for (int step = 0; scheduler.has_unfinished() && step < 1000; ++step) {
    collect(run_step(scheduler, runner));
  }
  EXPECT_EQ(outputs.at(a), expected(prompt_a, 6));
  EXPECT_EQ(outputs.at(b), expected(prompt_b, 6));
  expect_nothing_held(scheduler);
}

TEST(SchedulerTest, ReusesASharedSystemPromptFromTheCache) {
  Scheduler scheduler = make_scheduler(small_config(32, 4, 64));
  FakeModelRunner runner(32, 4, kTestVocab);
  std::vector<int32_t> first_prompt = iota_tokens(16, 30);
  std::vector<int32_t> second_prompt = first_prompt;
  first_prompt.push_back(1);
  second_prompt.push_back(2);
  const SeqId first = add(scheduler, first_prompt, 2);
  run_step(scheduler, runner);
  const SeqId second = add(scheduler, second_prompt, 2);
  StepTrace trace = run_step(scheduler, runner);
  ASSERT_EQ(trace.entries.size(), 2u);
  EXPECT_EQ(trace.entries[1].seq_id, second);
  EXPECT_EQ(trace.entries[1].num_cached_before, 16);
  EXPECT_EQ(trace.entries[1].num_new_tokens, 1);
  const std::map<SeqId, std::vector<int32_t>> outputs = run_to_completion(scheduler, runner);
  EXPECT_EQ(outputs.at(second).size(), 1u);  // the first token came with the prefill above
  EXPECT_EQ(outputs.at(second).back(), expected(second_prompt, 2).back());
  EXPECT_FALSE(outputs.contains(first));  // finished in the step above
  EXPECT_EQ(scheduler.block_manager().prefix_cache_stats().hit_tokens, 16);
  expect_nothing_held(scheduler);
}

TEST(SchedulerTest, AbortsAnywhereAndFreesEverything) {
  Scheduler scheduler = make_scheduler(small_config(16, 4, 4));
  FakeModelRunner runner(16, 4, kTestVocab);
  const SeqId decoding = add(scheduler, {1, 2}, 50);
  const SeqId prefilling = add(scheduler, iota_tokens(12, 10), 5);
  const SeqId waiting = add(scheduler, iota_tokens(4, 30), 5);
  run_step(scheduler, runner);  // decoding: 2 tokens; prefilling: first 2 of 12
  run_step(scheduler, runner);
  EXPECT_EQ(scheduler.find(prefilling)->status(), SequenceStatus::kRunning);
  EXPECT_TRUE(scheduler.find(prefilling)->is_prefilling());
  EXPECT_EQ(scheduler.find(waiting)->status(), SequenceStatus::kWaiting);

  EXPECT_TRUE(scheduler.abort(waiting).ok());
  EXPECT_TRUE(scheduler.abort(prefilling).ok());
  EXPECT_EQ(scheduler.find(waiting), nullptr);
  EXPECT_FALSE(scheduler.block_manager().has_table(prefilling));
  EXPECT_EQ(scheduler.abort(prefilling).code(), StatusCode::kNotFound);
  EXPECT_EQ(scheduler.abort(12345).code(), StatusCode::kNotFound);

  // During a step the runner may still write the blocks: they are freed at postprocess().
  const ScheduledBatch batch = scheduler.schedule();
  ASSERT_EQ(batch.entries.size(), 1u);
  const std::vector<int32_t> sampled = runner.run(batch, scheduler.block_manager());
  EXPECT_TRUE(scheduler.abort(decoding).ok());
  EXPECT_TRUE(scheduler.block_manager().has_table(decoding));
  EXPECT_EQ(scheduler.abort(decoding).code(), StatusCode::kNotFound);
  Result<std::vector<SequenceUpdate>> updates = scheduler.postprocess(batch, sampled);
  ASSERT_TRUE(updates.ok()) << updates.status().to_string();
  EXPECT_TRUE(updates->empty());
  EXPECT_FALSE(scheduler.has_unfinished());
  EXPECT_EQ(scheduler.find(decoding), nullptr);
  expect_nothing_held(scheduler);
}

TEST(SchedulerTest, PostprocessChecksItsInputBeforeApplyingIt) {
  Scheduler scheduler = make_scheduler(small_config(16, 4, 16));
  FakeModelRunner runner(16, 4, kTestVocab);
  const SeqId id = add(scheduler, {1, 2, 3}, 4);
  const ScheduledBatch batch = scheduler.schedule();
  ASSERT_EQ(batch.num_samples, 1);
  const int32_t too_many[] = {1, 2};
  const int32_t outside[] = {kTestVocab};
  EXPECT_EQ(scheduler.postprocess(batch, too_many).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.postprocess(batch, outside).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.find(id)->num_computed_tokens(), 0);
  const std::vector<int32_t> sampled = runner.run(batch, scheduler.block_manager());
  ASSERT_TRUE(scheduler.postprocess(batch, sampled).ok());
  EXPECT_EQ(scheduler.find(id)->num_computed_tokens(), 3);
  EXPECT_EQ(scheduler.postprocess(batch, sampled).status().code(), StatusCode::kFailedPrecondition);
}

TEST(SchedulerTest, PinnedSequencesKeepTheirBlocksAfterFinishing) {
  Scheduler scheduler = make_scheduler(small_config(8, 4, 16));
  FakeModelRunner runner(8, 4, kTestVocab);
  const SeqId id = add(scheduler, iota_tokens(6), 1);
  const ScheduledBatch batch = scheduler.schedule();
  // E.g. the prefill node starts sending this sequence's KV as soon as it is scheduled.
  ASSERT_TRUE(scheduler.block_manager().pin(id).ok());
  const std::vector<int32_t> sampled = runner.run(batch, scheduler.block_manager());
  Result<std::vector<SequenceUpdate>> updates = scheduler.postprocess(batch, sampled);
  ASSERT_TRUE(updates.ok());
  ASSERT_EQ(updates->size(), 1u);
  EXPECT_EQ((*updates)[0].finish_reason, FinishReason::kLength);
  EXPECT_FALSE(scheduler.has_unfinished());
  EXPECT_EQ(scheduler.block_manager().num_used_blocks(), 2);
  EXPECT_TRUE(scheduler.block_manager().check_invariants().ok());
  ASSERT_TRUE(scheduler.block_manager().unpin(id).ok());
  expect_nothing_held(scheduler);
  EXPECT_EQ(scheduler.block_manager().num_cached_blocks(), 1);
}

}  // namespace
}  // namespace pdserve
