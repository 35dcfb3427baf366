// Many random requests driven to completion through a constrained scheduler (small KV pool,
// small token budget, few sequences, a short queue, random aborts, some of them mid-step),
// checked step by step against the scheduling rules and at the end against the fake model's
// output for each request alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/engine/scheduler.h"
#include "engine_test_util.h"
#include "fake_model_runner.h"

namespace pdserve {
namespace {

using testing::expected_output;
using testing::FakeModelRunner;
using testing::kTestEos;
using testing::kTestVocab;
using testing::StepTrace;
using testing::trace_of;

struct Request {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

std::vector<Request> random_requests(std::mt19937_64& rng, int count) {
  // A few shared system prompts so that prefixes repeat.
  std::vector<std::vector<int32_t>> system_prompts(3);
  for (auto& prompt : system_prompts) {
    prompt.resize(rng() % 21);
    for (int32_t& token : prompt) token = static_cast<int32_t>(1 + rng() % (kTestVocab - 1));
  }
  std::vector<Request> requests(static_cast<size_t>(count));
  for (Request& request : requests) {
    request.prompt = system_prompts[rng() % system_prompts.size()];
    const size_t suffix = 1 + rng() % 30;
    for (size_t i = 0; i < suffix; ++i) {
      request.prompt.push_back(static_cast<int32_t>(1 + rng() % (kTestVocab - 1)));
    }
    request.params.temperature = 0.0f;
    request.params.max_tokens = static_cast<int>(1 + rng() % 24);
    request.params.ignore_eos = rng() % 2 == 0;
  }
  return requests;
}

struct Totals {
  int preemptions = 0;
  int aborts = 0;
  int partial_chunks = 0;
  int64_t hit_tokens = 0;
};

// Per-sequence expectation for the next scheduled chunk.
constexpr int kFreshAdmission = -1;

class StressRun {
 public:
  StressRun(const SchedulerConfig& config, std::vector<Request> requests, uint64_t seed,
            double abort_probability)
      : config_(config),
        requests_(std::move(requests)),
        rng_(seed),
        abort_probability_(abort_probability),
        scheduler_(Scheduler::create(config).value()),
        runner_(config.num_blocks, config.block_size, config.vocab_size) {}

  void run() {
    size_t next_request = 0;
    for (int step = 0; step < 200000; ++step) {
      // Requests arrive a few at a time; a full queue defers them to later steps.
      for (int arrivals = static_cast<int>(rng_() % 4); arrivals > 0; --arrivals) {
        if (next_request == requests_.size()) break;
        const Request& request = requests_[next_request];
        Result<SeqId> id = scheduler_.add_request(request.prompt, request.params);
        if (!id.ok()) {
          ASSERT_EQ(id.status().code(), StatusCode::kResourceExhausted) << id.status().to_string();
          // Preempted sequences return to the queue even beyond the cap.
          ASSERT_GE(scheduler_.num_waiting(), config_.max_num_waiting);
          break;
        }
        request_of_[*id] = next_request++;
        live_.push_back(*id);
        next_chunk_[*id] = kFreshAdmission;
      }
      if (next_request == requests_.size() && !scheduler_.has_unfinished()) break;
      maybe_abort();
      ASSERT_NO_FATAL_FAILURE(one_step());
    }
    ASSERT_EQ(next_request, requests_.size());
    ASSERT_FALSE(scheduler_.has_unfinished());
    const BlockManager& blocks = scheduler_.block_manager();
    EXPECT_EQ(blocks.num_used_blocks(), 0);
    EXPECT_EQ(blocks.num_free_blocks() + blocks.num_cached_blocks(), blocks.num_blocks());
    totals_.hit_tokens = blocks.prefix_cache_stats().hit_tokens;
  }

  // Outputs of requests that ran to the end, by request index.
  const std::map<size_t, std::vector<int32_t>>& finished_outputs() const { return finished_; }
  const Totals& totals() const { return totals_; }

 private:
  void maybe_abort() {
    if (live_.empty() || std::uniform_real_distribution<>(0, 1)(rng_) >= abort_probability_) {
      return;
    }
    const size_t index = rng_() % live_.size();
    const SeqId id = live_[index];
    ASSERT_TRUE(scheduler_.abort(id).ok());
    forget(id);
    ++totals_.aborts;
  }

  void forget(SeqId id) {
    live_.erase(std::find(live_.begin(), live_.end(), id));
    outputs_.erase(id);
    next_chunk_.erase(id);
  }

  void one_step() {
    int ready_decodes = 0;
    for (SeqId id : live_) {
      const Sequence* seq = scheduler_.find(id);
      if (seq->status() == SequenceStatus::kRunning && !seq->is_prefilling()) ++ready_decodes;
    }
    const ScheduledBatch batch = scheduler_.schedule();
    const StepTrace trace = trace_of(batch);
    ASSERT_NO_FATAL_FAILURE(check_plan(batch, trace, ready_decodes));
    const std::vector<int32_t> sampled = runner_.run(batch, scheduler_.block_manager());
    ASSERT_FALSE(::testing::Test::HasFailure());

    // Sometimes a client goes away while its step is running.
    std::vector<SeqId> aborted_in_step;
    if (!trace.entries.empty() &&
        std::uniform_real_distribution<>(0, 1)(rng_) < abort_probability_) {
      const SeqId id = trace.entries[rng_() % trace.entries.size()].seq_id;
      ASSERT_TRUE(scheduler_.abort(id).ok());
      ASSERT_TRUE(scheduler_.block_manager().has_table(id));  // still in the runner's hands
      forget(id);
      aborted_in_step.push_back(id);
      ++totals_.aborts;
    }
    Result<std::vector<SequenceUpdate>> updates = scheduler_.postprocess(batch, sampled);
    ASSERT_TRUE(updates.ok()) << updates.status().to_string();
    for (SeqId id : aborted_in_step) {
      ASSERT_FALSE(scheduler_.block_manager().has_table(id));
    }
    for (const SequenceUpdate& update : *updates) {
      outputs_[update.seq_id].push_back(update.token);
      if (update.finish_reason == FinishReason::kNone) continue;
      finished_[request_of_.at(update.seq_id)] = outputs_[update.seq_id];
      forget(update.seq_id);
    }
    const Status invariants = scheduler_.block_manager().check_invariants();
    ASSERT_TRUE(invariants.ok()) << invariants.to_string();
  }

  void check_plan(const ScheduledBatch& batch, const StepTrace& trace, int ready_decodes) {
    ASSERT_LE(trace.num_batched_tokens, config_.max_num_batched_tokens);
    ASSERT_LE(static_cast<int>(trace.entries.size()), config_.max_num_seqs);
    ASSERT_LE(scheduler_.num_running(), config_.max_num_seqs);
    totals_.preemptions += static_cast<int>(trace.preempted.size());
    for (SeqId id : trace.preempted) next_chunk_[id] = kFreshAdmission;
    // Decodes first; when any prefill runs, every decode that was ready runs too.
    const bool has_prefill = static_cast<int>(trace.entries.size()) > trace.num_decodes;
    if (has_prefill && trace.preempted.empty()) {
      ASSERT_EQ(trace.num_decodes, ready_decodes);
    }
    int tokens = 0;
    for (size_t i = 0; i < trace.entries.size(); ++i) {
      const testing::StepEntry& entry = trace.entries[i];
      const Sequence& seq = *batch.entries[i].sequence;
      tokens += entry.num_new_tokens;
      if (static_cast<int>(i) < trace.num_decodes) {
        ASSERT_EQ(entry.num_new_tokens, 1);
        ASSERT_EQ(entry.num_cached_before, seq.num_tokens() - 1);
      }
      // Chunks are contiguous: each starts where the last one ended, or, on (re)admission,
      // at a block boundary given by the prefix cache.
      int& next = next_chunk_.at(entry.seq_id);
      if (next == kFreshAdmission) {
        ASSERT_EQ(entry.num_cached_before % config_.block_size, 0);
        ASSERT_LT(entry.num_cached_before, seq.num_tokens());
        // FCFS: first admissions happen in arrival (= id) order.
        if (!admitted_.contains(entry.seq_id)) {
          ASSERT_GT(entry.seq_id, last_first_admitted_);
          last_first_admitted_ = entry.seq_id;
          admitted_.insert(entry.seq_id);
        }
      } else {
        ASSERT_EQ(entry.num_cached_before, next) << "sequence " << entry.seq_id;
      }
      next = entry.num_cached_before + entry.num_new_tokens;
      ASSERT_EQ(entry.samples, next == seq.num_tokens());
      if (!entry.samples) ++totals_.partial_chunks;
    }
    ASSERT_EQ(tokens, trace.num_batched_tokens);
  }

  SchedulerConfig config_;
  std::vector<Request> requests_;
  std::mt19937_64 rng_;
  double abort_probability_;
  Scheduler scheduler_;
  FakeModelRunner runner_;
  std::vector<SeqId> live_;
  std::map<SeqId, size_t> request_of_;
  std::map<SeqId, std::vector<int32_t>> outputs_;
  std::map<SeqId, int> next_chunk_;
  std::set<SeqId> admitted_;
  SeqId last_first_admitted_ = -1;
  std::map<size_t, std::vector<int32_t>> finished_;
  Totals totals_;
};

SchedulerConfig stress_config(int num_blocks, int block_size, int budget, int max_seqs) {
  SchedulerConfig config;
  config.num_blocks = num_blocks;
  config.block_size = block_size;
  config.max_num_batched_tokens = budget;
  config.max_num_seqs = max_seqs;
  config.max_num_waiting = 6;
  config.vocab_size = kTestVocab;
  config.eos_token_ids = {kTestEos};
  return config;
}

void expect_outputs_match_the_model(const std::vector<Request>& requests,
                                    const std::map<size_t, std::vector<int32_t>>& outputs) {
  const int32_t eos[] = {kTestEos};
  for (const auto& [index, output] : outputs) {
    EXPECT_EQ(output,
              expected_output(requests[index].prompt, requests[index].params, eos, kTestVocab))
        << "request " << index;
  }
}

TEST(SchedulerStressTest, UnconstrainedRunMatchesTheModel) {
  std::mt19937_64 rng(1);
  const std::vector<Request> requests = random_requests(rng, 100);
  StressRun run(stress_config(4096, 4, 1 << 16, 256), requests, 1, 0.0);
  ASSERT_NO_FATAL_FAILURE(run.run());
  EXPECT_EQ(run.finished_outputs().size(), requests.size());
  expect_outputs_match_the_model(requests, run.finished_outputs());
  EXPECT_EQ(run.totals().preemptions, 0);
}

TEST(SchedulerStressTest, ConstrainedRunsWithAbortsMatchTheModelAndLeakNothing) {
  constexpr uint64_t kSeeds = 200;
  Totals totals;
  size_t finished = 0;
  for (uint64_t seed = 1; seed <= kSeeds; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const std::vector<Request> requests = random_requests(rng, 150);
    const int block_size = 1 + static_cast<int>(rng() % 8);
    // Room for the longest request (20 + 30 + 24 tokens) and not much more.
    const int num_blocks = (74 + block_size - 1) / block_size + static_cast<int>(rng() % 12);
    const int budgets[] = {1, 3, 8, 16, 64};
    const int budget = budgets[rng() % 5];
    const int max_seqs = 1 + static_cast<int>(rng() % 8);
    StressRun run(stress_config(num_blocks, block_size, budget, max_seqs), requests, seed, 0.01);
    ASSERT_NO_FATAL_FAILURE(run.run());
    expect_outputs_match_the_model(requests, run.finished_outputs());
    finished += run.finished_outputs().size();
    totals.preemptions += run.totals().preemptions;
    totals.aborts += run.totals().aborts;
    totals.partial_chunks += run.totals().partial_chunks;
    totals.hit_tokens += run.totals().hit_tokens;
  }
  // The runs exercised what they are meant to.
  EXPECT_GT(totals.preemptions, 1000);
  EXPECT_GT(totals.aborts, 1000);
  EXPECT_GT(totals.partial_chunks, 10000);
  EXPECT_GT(totals.hit_tokens, 10000);
  EXPECT_GT(finished, kSeeds * 100u);
  std::printf(
      "constrained runs: %zu finished, %d preemptions, %d aborts, %d partial chunks, "
      "%lld prefix-hit tokens\n",
      finished, totals.preemptions, totals.aborts, totals.partial_chunks,
      static_cast<long long>(totals.hit_tokens));
}

}  // namespace
}  // namespace pdserve
