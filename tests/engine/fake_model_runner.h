// A deterministic stand-in for the model runner. It keeps a fake KV pool holding, for every
// slot, the token and position written there, and for each scheduled sequence:
//  * checks that the context it would attend to (positions before the new tokens, read
//    through the block table) holds exactly the sequence's own tokens at their positions,
//    so a wrong block table, a bad prefix-cache hit or a reused live block is caught;
//  * checks that it writes only into blocks no other table references;
//  * writes the new tokens, and when the entry samples, returns a "next token" that is a hash
//    of the whole context as read back from the fake KV.
// The same request therefore yields the same output under any schedule.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/engine/block_manager.h"
#include "common/engine/scheduler.h"

namespace pdserve::testing {

// The fake model's next token for this context, in [0, vocab_size).
int32_t fake_next_token(std::span<const int32_t> context, int vocab_size);

class FakeModelRunner {
 public:
  FakeModelRunner(int num_blocks, int block_size, int vocab_size);

  // Records a gtest failure for every inconsistency found; returns one token per sampling
  // entry, in entry order.
  std::vector<int32_t> run(const ScheduledBatch& batch, const BlockManager& block_manager);
  // Writes positions [from_position, tokens.size()) as a remote node's KV transfer would.
  void write_remote_kv(std::span<const int32_t> tokens, std::span<const int32_t> block_table,
                       int from_position);

 private:
  struct Slot {
    int32_t token = -1;
    int32_t position = -1;
  };
  int block_size_;
  int vocab_size_;
  std::vector<Slot> kv_;
};

}  // namespace pdserve::testing

namespace pdserve::testing {

// What one step scheduled, copied out of the batch (whose pointers die at postprocess()).
struct StepEntry {
  SeqId seq_id = 0;
  int num_new_tokens = 0;
  int num_cached_before = 0;
  bool samples = false;
};
struct StepTrace {
  std::vector<StepEntry> entries;
  int num_decodes = 0;
  int num_batched_tokens = 0;
  std::vector<SeqId> preempted;
  std::vector<SequenceUpdate> updates;
};

// schedule(), the fake model, postprocess(); a gtest failure for any error.
StepTrace run_step(Scheduler& scheduler, FakeModelRunner& runner);
StepTrace trace_of(const ScheduledBatch& batch);

// The tokens the fake model generates for `prompt` alone: the oracle for every schedule.
std::vector<int32_t> expected_output(std::span<const int32_t> prompt, const SamplingParams& params,
                                     std::span<const int32_t> eos_token_ids, int vocab_size);

}  // namespace pdserve::testing
