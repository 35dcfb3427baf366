// One request's sequence as the engine sees it: its tokens (prompt, then generated output),
// how many of them already have KV in the cache, where it stands in its life cycle, and the
// sampling parameters and stop rules it was submitted with. The block table lives in the
// BlockManager (one owner, so that reference counts can be checked against it).
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "common/sampling/sampling_params.h"
#include "common/sampling/stop_checker.h"

namespace pdserve {

using SeqId = int64_t;

enum class SequenceStatus {
  kWaiting,     // queued, never scheduled here (or its remote prefill failed: local now)
  kRunning,     // holds blocks; prefilling or decoding
  kPreempted,   // lost its blocks to a decode that needed them; queued for recomputation
  kAwaitingKv,  // holds blocks; its prompt's KV is being computed elsewhere and sent here
  kLoadingKv,   // holds blocks; a prefix hit in a lower KV tier is being reloaded into them
  kFinished,    // stopped by its StopChecker; see finish_reason()
  kAborted,     // cancelled by the client or the server
};

std::string_view sequence_status_name(SequenceStatus status);

class Sequence {
 public:
  // `arrival_order` breaks ties FCFS and picks preemption victims (latest first).
  Sequence(SeqId id, std::vector<int32_t> prompt_tokens, SamplingParams params,
           StopChecker stop_checker, uint64_t arrival_order,
           std::chrono::steady_clock::time_point arrival_time);

  SeqId id() const { return id_; }
  uint64_t arrival_order() const { return arrival_order_; }
  std::chrono::steady_clock::time_point arrival_time() const { return arrival_time_; }
  const SamplingParams& sampling_params() const { return params_; }
  const StopChecker& stop_checker() const { return stop_checker_; }

  // Prompt then output tokens, contiguous, so a chunk is a plain subspan.
  std::span<const int32_t> tokens() const { return tokens_; }
  std::span<const int32_t> prompt_tokens() const;
  std::span<const int32_t> output_tokens() const;
  int num_tokens() const { return static_cast<int>(tokens_.size()); }
  int num_prompt_tokens() const { return num_prompt_tokens_; }
  int num_output_tokens() const { return num_tokens() - num_prompt_tokens_; }

  // Tokens whose KV is in the cache. The rest (at least the last token) must be computed
  // before the next token can be sampled.
  int num_computed_tokens() const { return num_computed_tokens_; }
  int num_uncomputed_tokens() const { return num_tokens() - num_computed_tokens_; }
  // True while the whole prompt (and, after a preemption, the earlier output) is not yet in
  // the cache; false in the decode phase, when only the last sampled token is missing.
  bool is_prefilling() const { return num_uncomputed_tokens() > 1; }

  SequenceStatus status() const { return status_; }
  bool is_done() const {
    return status_ == SequenceStatus::kFinished || status_ == SequenceStatus::kAborted;
  }
  FinishReason finish_reason() const { return finish_reason_; }

  // State changes, made by the scheduler and the block manager.
  void set_status(SequenceStatus status) { status_ = status; }
  void set_num_computed_tokens(int num_computed_tokens);
  // Appends a sampled token and runs the stop checker on it; returns the finish reason
  // (kNone while the sequence continues) and marks the sequence finished when it is not kNone.
  FinishReason append_output_token(int32_t token);

  // Speculative decoding: the tokens a proposer guessed to follow this sequence, verified by
  // the next step that schedules it (and dropped then, or when it is preempted).
  std::span<const int32_t> draft_tokens() const { return draft_tokens_; }
  void set_draft_tokens(std::vector<int32_t> draft_tokens) {
    draft_tokens_ = std::move(draft_tokens);
  }
  void clear_draft_tokens() { draft_tokens_.clear(); }

 private:
  SeqId id_;
  std::vector<int32_t> tokens_;
  int num_prompt_tokens_;
  int num_computed_tokens_ = 0;
  SamplingParams params_;
  StopChecker stop_checker_;
  uint64_t arrival_order_;
  std::chrono::steady_clock::time_point arrival_time_;
  SequenceStatus status_ = SequenceStatus::kWaiting;
  FinishReason finish_reason_ = FinishReason::kNone;
  std::vector<int32_t> draft_tokens_;
};

}  // namespace pdserve
