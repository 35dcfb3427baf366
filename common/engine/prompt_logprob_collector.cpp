#include "common/engine/prompt_logprob_collector.h"

#include <algorithm>
#include <span>
#include <string>
#include <utility>

namespace pdserve {

Status PromptLogprobCollector::collect(const ScheduledBatch& batch, size_t entry,
                                       std::vector<PromptTokenLogprob>& collected) {
  const ScheduledSequence& scheduled = batch.entries[entry];
  const Sequence& seq = *scheduled.sequence;
  const int top = seq.sampling_params().prompt_logprobs.value_or(0);
  // The logits row of position q judges prompt token q + 1: rows 0 .. P - 2 are wanted.
  const int last_row = seq.num_prompt_tokens() - 1;
  const int chunk_begin = scheduled.num_cached_before;
  const int chunk_end = std::min(chunk_begin + scheduled.num_new_tokens, last_row);
  int next = static_cast<int>(collected.size());  // the next row wanted
  if (next >= chunk_end) return Status::ok_status();
  if (next < chunk_begin) {
    return internal_error("prompt logprobs: positions " + std::to_string(next) + " to " +
                          std::to_string(chunk_begin - 1) +
                          " of the prompt were not computed here");
  }
  const int vocab = executor_.vocab_size();
  const int max_rows = executor_.max_token_logits();
  if (max_rows < 1) return internal_error("this model executor does not compute prompt logits");
  const std::span<const int32_t> prompt = seq.prompt_tokens();
  while (next < chunk_end) {
    const int count = std::min(max_rows, chunk_end - next);
    logits_.resize(static_cast<size_t>(count) * static_cast<size_t>(vocab));
    PDS_RETURN_IF_ERROR(
        executor_.token_logits(static_cast<int>(entry), next - chunk_begin, count, logits_));
    for (int row = 0; row < count; ++row) {
      const std::span<const float> logits(logits_.data() + static_cast<size_t>(row) * vocab,
                                          static_cast<size_t>(vocab));
      Result<PromptTokenLogprob> judged =
          prompt_token_logprob(sampler_, logits, prompt[static_cast<size_t>(next + row + 1)], top);
      if (!judged.ok()) {
        return internal_error("prompt logprobs at position " + std::to_string(next + row + 1) +
                              ": " + judged.status().message());
      }
      collected.push_back(std::move(judged).value());
    }
    next += count;
  }
  return Status::ok_status();
}

}  // namespace pdserve
