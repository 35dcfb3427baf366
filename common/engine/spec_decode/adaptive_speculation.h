// When a sequence proposes drafts at all (auto-off). Verifying k drafts makes a step dearer
// (1 + k tokens through the model, k + 1 logits rows); it pays only when enough drafts are
// accepted. The rule, per sequence:
//   speculate while a >= 0.25 and 1 + a >= r * (1 + kMargin)
// where a is the sequence's mean accepted drafts per verify step (an exponential average,
// weight kAcceptanceWeight, starting at the engine's prior: the mean over all verify steps,
// weight kPriorWeight, itself starting at k, so that the first sequences try and a new
// sequence on an engine whose drafts fail starts off) and r is the measured cost ratio
// (time per sequence of decode-only steps with verify rows) / (the same without), both
// exponential averages over this engine's steps. Until a plain decode step has been timed
// nobody speculates (a first decode costs nothing extra); until a verify step has, r is 1.
// A sequence whose rule fails proposes only on every probe_interval()-th step (a probe that
// refreshes a): max(kMinProbeInterval, (r - 1) / kProbeBudget) steps, so that probing costs
// at most kProbeBudget of plain decoding however dear a verify step is. A proposer with nothing
// to propose (no n-gram match) costs nothing: the row is a plain decode. Steps with prefill
// chunks are not timed. Seeded sampled requests use the rule without times (should_propose).
#pragma once

#include <chrono>
#include <unordered_map>

#include "common/engine/sequence.h"

namespace pdserve {

class AdaptiveSpeculation {
 public:
  static constexpr double kMargin = 0.02;
  static constexpr double kAcceptanceWeight = 0.5;
  static constexpr double kPriorWeight = 0.5;
  static constexpr double kCostWeight = 0.1;
  static constexpr int kMinProbeInterval = 16;
  static constexpr double kProbeBudget = 0.02;

  explicit AdaptiveSpeculation(int num_speculative_tokens);

  // Whether `seq_id` proposes for its next step (counts the step for the probes).
  // `reproducible` (a seeded sampled request, whose draws depend on which steps verify): the
  // rule without measured times (r = 1, probes every kMinProbeInterval steps), so that the
  // same seed in the same batch gives the same tokens however fast the steps ran.
  bool should_propose(SeqId seq_id, bool reproducible = false);
  // A verify step of `seq_id` accepted `accepted` drafts.
  void record_verify(SeqId seq_id, int accepted);
  // A decode-only step (no prefill chunk) of `num_rows` sequences, `verify_rows` of which
  // verified drafts, took `elapsed`.
  void record_step(int num_rows, int verify_rows, std::chrono::duration<double> elapsed);
  void release(SeqId seq_id) { sequences_.erase(seq_id); }

  // The current cost ratio r (1 until measured) and a sequence's mean accepted drafts.
  double cost_ratio() const;
  int probe_interval() const;
  double mean_accepted(SeqId seq_id) const;

 private:
  struct SequenceState {
    double mean_accepted;
    int steps_off = 0;  // steps since the rule last failed, for the probes
  };

  double initial_acceptance_;           // the prior of a new sequence's mean accepted drafts
  double plain_seconds_per_row_ = 0.0;  // 0: not measured yet
  double verify_seconds_per_row_ = 0.0;
  std::unordered_map<SeqId, SequenceState> sequences_;
};

}  // namespace pdserve
