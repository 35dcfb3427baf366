#include "fake_model_runner.h"

#include <gtest/gtest.h>

namespace pdserve::testing {

int32_t fake_next_token(std::span<const int32_t> context, int vocab_size) {
  uint64_t state = 0x243f6a8885a308d3ULL;
  for (size_t i = 0; i < context.size(); ++i) {
    state ^=
        static_cast<uint64_t>(context[i]) + 0x9e3779b97f4a7c15ULL + (state << 6) + (state >> 2) + i;
  }
  state ^= state >> 31;
  state *= 0xbf58476d1ce4e5b9ULL;
  state ^= state >> 29;
  return static_cast<int32_t>(state % static_cast<uint64_t>(vocab_size));
}

FakeModelRunner::FakeModelRunner(int num_blocks, int block_size, int vocab_size)
    : block_size_(block_size),
      vocab_size_(vocab_size),
      kv_(static_cast<size_t>(num_blocks) * static_cast<size_t>(block_size)) {}

std::vector<int32_t> FakeModelRunner::run(const ScheduledBatch& batch,
                                          const BlockManager& block_manager) {
  std::vector<int32_t> sampled;
  for (const ScheduledSequence& entry : batch.entries) {
    const Sequence& seq = *entry.sequence;
    const std::span<const int32_t> tokens = seq.tokens();
    const int end = entry.num_cached_before + entry.num_new_tokens;
    EXPECT_GT(entry.num_new_tokens, 0) << "sequence " << seq.id();
    EXPECT_LE(end, seq.num_tokens()) << "sequence " << seq.id();
    EXPECT_GE(static_cast<int>(entry.block_table.size()) * block_size_, end)
        << "sequence " << seq.id() << ": block table too short";
    if (::testing::Test::HasFailure()) return std::vector<int32_t>(batch.num_samples, 0);

    auto slot_of = [&](int position) -> Slot& {
      const int32_t block = entry.block_table[static_cast<size_t>(position / block_size_)];
      return kv_[static_cast<size_t>(block) * static_cast<size_t>(block_size_) +
                 static_cast<size_t>(position % block_size_)];
    };
    for (int position = 0; position < entry.num_cached_before; ++position) {
      const Slot& slot = slot_of(position);
      if (slot.token != tokens[static_cast<size_t>(position)] || slot.position != position) {
        ADD_FAILURE() << "sequence " << seq.id() << " position " << position << " reads KV of ("
                      << slot.token << ", " << slot.position << ") instead of ("
                      << tokens[static_cast<size_t>(position)] << ", " << position << ")";
        break;
      }
    }
    for (int position = entry.num_cached_before; position < end; ++position) {
      const int32_t block = entry.block_table[static_cast<size_t>(position / block_size_)];
      EXPECT_EQ(block_manager.ref_count(block), 1)
          << "sequence " << seq.id() << " writes into shared block " << block;
      slot_of(position) = {tokens[static_cast<size_t>(position)], position};
    }
    if (!entry.samples) continue;
    std::vector<int32_t> context;
    context.reserve(static_cast<size_t>(end));
    for (int position = 0; position < end; ++position) context.push_back(slot_of(position).token);
    sampled.push_back(fake_next_token(context, vocab_size_));
  }
  return sampled;
}

void FakeModelRunner::write_remote_kv(std::span<const int32_t> tokens,
                                      std::span<const int32_t> block_table, int from_position) {
  for (int position = from_position; position < static_cast<int>(tokens.size()); ++position) {
    const int32_t block = block_table[static_cast<size_t>(position / block_size_)];
    kv_[static_cast<size_t>(block) * static_cast<size_t>(block_size_) +
        static_cast<size_t>(position % block_size_)] = {tokens[static_cast<size_t>(position)],
                                                        position};
  }
}

}  // namespace pdserve::testing

namespace pdserve::testing {

StepTrace trace_of(const ScheduledBatch& batch) {
  StepTrace trace;
  for (const ScheduledSequence& entry : batch.entries) {
    trace.entries.push_back(
        {entry.sequence->id(), entry.num_new_tokens, entry.num_cached_before, entry.samples});
  }
  trace.num_decodes = batch.num_decodes;
  trace.num_batched_tokens = batch.num_batched_tokens;
  trace.preempted = batch.preempted;
  return trace;
}

StepTrace run_step(Scheduler& scheduler, FakeModelRunner& runner) {
  const ScheduledBatch batch = scheduler.schedule();
  StepTrace trace = trace_of(batch);
  const std::vector<int32_t> sampled = runner.run(batch, scheduler.block_manager());
  Result<std::vector<SequenceUpdate>> updates = scheduler.postprocess(batch, sampled);
  EXPECT_TRUE(updates.ok()) << updates.status().to_string();
  if (updates.ok()) trace.updates = std::move(updates).value();
  const Status invariants = scheduler.block_manager().check_invariants();
  EXPECT_TRUE(invariants.ok()) << invariants.to_string();
  return trace;
}

std::vector<int32_t> expected_output(std::span<const int32_t> prompt, const SamplingParams& params,
                                     std::span<const int32_t> eos_token_ids, int vocab_size) {
  Result<StopChecker> stop = StopChecker::create(params, eos_token_ids, vocab_size);
  EXPECT_TRUE(stop.ok()) << stop.status().to_string();
  std::vector<int32_t> context(prompt.begin(), prompt.end());
  std::vector<int32_t> output;
  while (true) {
    const int32_t token = fake_next_token(context, vocab_size);
    context.push_back(token);
    output.push_back(token);
    if (stop->check(output) != FinishReason::kNone) return output;
  }
}

}  // namespace pdserve::testing
