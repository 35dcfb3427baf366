#include "common/engine/spec_decode/adaptive_speculation.h"

#include <algorithm>
#include <cmath>

namespace pdserve {
namespace {

// Below this many accepted drafts per verify step no measured cost ratio is trusted: the
// ratio comes from noisy step times, and a ratio measured at 1 would keep drafts that are
// never accepted.
constexpr double kMinMeanAccepted = 0.25;

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

int AdaptiveSpeculation::probe_interval() const {
  const double steps = std::ceil((cost_ratio() - 1.0) / kProbeBudget);
  return std::max(kMinProbeInterval, static_cast<int>(std::min(steps, 1e6)));
}

double AdaptiveSpeculation::mean_accepted(SeqId seq_id) const {
  auto it = sequences_.find(seq_id);
  return it == sequences_.end() ? initial_acceptance_ : it->second.mean_accepted;
}

bool AdaptiveSpeculation::should_propose(SeqId seq_id, bool reproducible) {
  // Without a timed plain step the cost of speculating is unknown: decode plainly first.
  if (plain_seconds_per_row_ <= 0.0 && !reproducible) return false;
  SequenceState& state =
      sequences_.try_emplace(seq_id, SequenceState{initial_acceptance_}).first->second;
  const double ratio = reproducible ? 1.0 : cost_ratio();
  if (state.mean_accepted >= kMinMeanAccepted &&
      1.0 + state.mean_accepted >= ratio * (1.0 + kMargin)) {
    state.steps_off = 0;
    return true;
  }
  if (++state.steps_off < (reproducible ? kMinProbeInterval : probe_interval())) return false;
  state.steps_off = 0;
  return true;
}

void AdaptiveSpeculation::record_verify(SeqId seq_id, int accepted) {
  SequenceState& state =
      sequences_.try_emplace(seq_id, SequenceState{initial_acceptance_}).first->second;
  state.mean_accepted = (1.0 - kAcceptanceWeight) * state.mean_accepted +
                        kAcceptanceWeight * static_cast<double>(accepted);
  // New sequences start from what this engine's drafts have recently achieved.
  initial_acceptance_ =
      (1.0 - kPriorWeight) * initial_acceptance_ + kPriorWeight * static_cast<double>(accepted);
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
