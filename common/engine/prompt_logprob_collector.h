// Prompt logprobs (SamplingParams::prompt_logprobs), collected step by step while a prompt is
// prefilled: after each forward the executor's token_logits() gives the logits rows of the
// entry's new prompt positions (at most max_token_logits() rows at a time, so a long prompt
// never needs more than one step's worth of extra host memory), and each row judges the prompt
// token after it. A chunked prefill adds its chunks in order; a preempted sequence, recomputed,
// skips the positions it already has. The positions must all be computed here: requests that
// want prompt logprobs bypass the prefix cache (BlockManager::allocate).
#pragma once

#include <vector>

#include "common/core/status.h"
#include "common/engine/model_executor.h"
#include "common/engine/scheduler.h"
#include "common/sampling/prompt_logprobs.h"
#include "common/sampling/sampler.h"

namespace pdserve {

class PromptLogprobCollector {
 public:
  // `executor` must outlive the collector.
  explicit PromptLogprobCollector(ModelExecutor& executor) : executor_(executor) {}

  // After the step of `batch` ran: appends to `collected` (the prompt positions 1, 2, ... so
  // far) those that entry `entry`'s new tokens judge. Internal when the executor fails or a
  // position before the entry's new tokens is missing (its KV came from elsewhere).
  Status collect(const ScheduledBatch& batch, size_t entry,
                 std::vector<PromptTokenLogprob>& collected);

 private:
  ModelExecutor& executor_;
  Sampler sampler_;
  std::vector<float> logits_;
};

}  // namespace pdserve
