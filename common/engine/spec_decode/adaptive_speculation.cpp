#include "common/engine/spec_decode/adaptive_speculation.h"

namespace pdserve {
namespace {

double blend(double average, double sample, double weight) {
  return average == 0.0 ? sample : (1.0 - weight) * average + weight * sample;
}

}  // namespace

AdaptiveSpeculation::AdaptiveSpeculation(int num_speculative_tokens)
    : initial_acceptance_(static_cast<double>(num_speculative_tokens)) {}

double AdaptiveSpeculation::cost_ratio() const {
  if (plain_seconds_per_row_ <= 0.0 || verify_seconds_per_row_ <= 0.0) return 1.0;
  return verify_seconds_per_row_ / plain_seconds_per_row_;
}

double AdaptiveSpeculation::mean_accepted(SeqId seq_id) const {
  auto it = sequences_.find(seq_id);
  return it == sequences_.end() ? initial_acceptance_ : it->second.mean_accepted;
}

bool AdaptiveSpeculation::should_propose(SeqId seq_id) {
  SequenceState& state =
      sequences_.try_emplace(seq_id, SequenceState{initial_acceptance_}).first->second;
  if (1.0 + state.mean_accepted >= cost_ratio() * (1.0 + kMargin)) {
    state.steps_off = 0;
    return true;
  }
  if (++state.steps_off < kProbeInterval) return false;
  state.steps_off = 0;
  return true;
}

void AdaptiveSpeculation::record_verify(SeqId seq_id, int accepted) {
  SequenceState& state =
      sequences_.try_emplace(seq_id, SequenceState{initial_acceptance_}).first->second;
  state.mean_accepted = (1.0 - kAcceptanceWeight) * state.mean_accepted +
                        kAcceptanceWeight * static_cast<double>(accepted);
  // New sequences start from what this engine's drafts have recently achieved.
  initial_acceptance_ = (1.0 - kPriorWeight) * initial_acceptance_ +
                        kPriorWeight * static_cast<double>(accepted);
}

void AdaptiveSpeculation::record_step(int num_rows, int verify_rows,
                                      std::chrono::duration<double> elapsed) {
  if (num_rows <= 0) return;
  const double per_row = elapsed.count() / static_cast<double>(num_rows);
  if (verify_rows > 0) {
    verify_seconds_per_row_ = blend(verify_seconds_per_row_, per_row, kCostWeight);
  } else {
    plain_seconds_per_row_ = blend(plain_seconds_per_row_, per_row, kCostWeight);
  }
}

}  // namespace pdserve
