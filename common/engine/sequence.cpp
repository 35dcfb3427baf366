#include "common/engine/sequence.h"

#include <string>
#include <utility>

namespace pdserve {

std::string_view sequence_status_name(SequenceStatus status) {
  switch (status) {
    case SequenceStatus::kWaiting:
      return "waiting";
    case SequenceStatus::kRunning:
      return "running";
    case SequenceStatus::kPreempted:
      return "preempted";
    case SequenceStatus::kFinished:
      return "finished";
    case SequenceStatus::kAwaitingKv:
      return "awaiting_kv";
    case SequenceStatus::kLoadingKv:
      return "loading_kv";
    case SequenceStatus::kAborted:
      return "aborted";
  }
  return "unknown";
}

Sequence::Sequence(SeqId id, std::vector<int32_t> prompt_tokens, SamplingParams params,
                   StopChecker stop_checker, uint64_t arrival_order,
                   std::chrono::steady_clock::time_point arrival_time)
    : id_(id),
      tokens_(std::move(prompt_tokens)),
      num_prompt_tokens_(static_cast<int>(tokens_.size())),
      params_(std::move(params)),
      stop_checker_(std::move(stop_checker)),
      arrival_order_(arrival_order),
      arrival_time_(arrival_time) {
  PDS_CHECK(!tokens_.empty(), "a sequence needs at least one prompt token");
}

std::span<const int32_t> Sequence::prompt_tokens() const {
  return std::span<const int32_t>(tokens_).first(static_cast<size_t>(num_prompt_tokens_));
}

std::span<const int32_t> Sequence::output_tokens() const {
  return std::span<const int32_t>(tokens_).subspan(static_cast<size_t>(num_prompt_tokens_));
}

void Sequence::set_num_computed_tokens(int num_computed_tokens) {
  PDS_CHECK(num_computed_tokens >= 0 && num_computed_tokens <= num_tokens(),
            "sequence " + std::to_string(id_) + ": " + std::to_string(num_computed_tokens) +
                " computed tokens out of " + std::to_string(num_tokens()));
  num_computed_tokens_ = num_computed_tokens;
}

FinishReason Sequence::append_output_token(int32_t token) {
  PDS_CHECK(!is_done(), "sequence " + std::to_string(id_) + " is already done");
  tokens_.push_back(token);
  finish_reason_ = stop_checker_.check(output_tokens());
  if (finish_reason_ != FinishReason::kNone) status_ = SequenceStatus::kFinished;
  return finish_reason_;
}

}  // namespace pdserve
