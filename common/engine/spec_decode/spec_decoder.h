// Speculative decoding in the engine's step (vLLM's spec-decode path), the one place
// EngineCore delegates it to:
//  * after a step, propose(): each decoding sequence the policy lets speculate
//    (adaptive_speculation.h) asks the Proposer for up to k drafts, capped so that the bonus
//    token stays within max_tokens; they go to the scheduler, which schedules the sequence as a
//    verify row of 1 + k tokens in the next batch, next to plain decodes and prefill chunks;
//  * after that step's forward, verify(): the executor's token_logits() gives the row's 1 + k
//    logits rows and the RejectionSampler turns them into the run of tokens the scheduler
//    appends (accepted drafts, then the correction or bonus token);
//  * counters for /metrics, per request for its timeline, and the step times the policy uses.
// Rows that never speculate: a structured output (its grammar matcher would have to be rolled
// back over rejected drafts), a test's scripted output, a sequence one token from max_tokens.
// On an executor that samples on its device, verify rows are left out of the device's
// sampling (nothing drawn there) and verified here on the host from token_logits().
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/core/status.h"
#include "common/engine/inference_service.h"
#include "common/engine/model_executor.h"
#include "common/engine/scheduler.h"
#include "common/engine/spec_decode/adaptive_speculation.h"
#include "common/engine/spec_decode/proposer.h"
#include "common/engine/spec_decode/rejection_sampler.h"
#include "common/engine/spec_decode/speculative_config.h"

namespace pdserve {

class SpecDecoder {
 public:
  // InvalidArgument when the executor cannot give 1 + k logits rows per entry.
  static Result<std::unique_ptr<SpecDecoder>> create(const SpeculativeConfig& config,
                                                     std::unique_ptr<Proposer> proposer,
                                                     ModelExecutor& executor);

  // A running sequence that may speculate next step.
  struct Candidate {
    const Sequence* sequence = nullptr;
    bool constrained = false;  // has a structured output
  };
  // Asks the proposer for the candidates' drafts and hands them to the scheduler. A proposer
  // error is logged and leaves this step without drafts.
  void propose(Scheduler& scheduler, std::span<const Candidate> candidates);

  // One verify row's outcome.
  struct VerifiedSequence {
    std::vector<SampleResult> tokens;  // what the scheduler appends, with their logprobs
    int num_drafts = 0;
    int num_accepted = 0;
    bool want_logprobs = false;
  };
  struct Verification {
    // One per sampling entry of the batch: a verify row's tokens, empty for the others (and
    // for a row that failed).
    std::vector<std::vector<int32_t>> runs;
    std::unordered_map<SeqId, VerifiedSequence> sequences;
    std::vector<std::pair<SeqId, Status>> failures;  // rows whose logits or sampling failed
  };
  // After the forward of `batch`: every verify row of a sequence that is not aborted.
  Verification verify(const ScheduledBatch& batch, const std::function<SamplerRng&(SeqId)>& rng_of);

  // The step's time from the forward's start to the end of verification.
  void record_step(const ScheduledBatch& batch, std::chrono::duration<double> elapsed);
  // The sequence left the running set: the proposer and the policy forget it.
  void release(SeqId seq_id);

  std::string_view method() const { return proposer_->method(); }
  const SpecDecodeCounts& counts() const { return counts_; }
  const AdaptiveSpeculation& policy() const { return policy_; }

 private:
  SpecDecoder(const SpeculativeConfig& config, std::unique_ptr<Proposer> proposer,
              ModelExecutor& executor);

  int num_speculative_tokens_;
  std::unique_ptr<Proposer> proposer_;
  ModelExecutor& executor_;
  AdaptiveSpeculation policy_;
  RejectionSampler rejection_sampler_;
  SpecDecodeCounts counts_;
  std::vector<float> logits_;
};

}  // namespace pdserve
