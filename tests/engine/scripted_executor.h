// A ModelExecutor that plays back a script per request, for the engine loop tests. The
// request is recognized by its first prompt token; output token k of the script gets logit
// kScriptLogit, kFallbackToken gets kFallbackLogit (what a greedy sampler picks when the
// script token is banned, e.g. EOS before min_tokens) and every other token 0. Failures and
// NaN rows can be injected. Written for one engine thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "common/engine/model_executor.h"

namespace pdserve::testing {

inline constexpr float kScriptLogit = 10.0f;
inline constexpr float kFallbackLogit = 5.0f;
inline constexpr int32_t kFallbackToken = 33;  // "B"

class ScriptedExecutor : public ModelExecutor {
 public:
  explicit ScriptedExecutor(int vocab_size) : vocab_size_(vocab_size) {}

  // The script of requests whose prompt starts with `first_token`; it repeats when exhausted.
  void set_script(int32_t first_token, std::vector<int32_t> tokens) {
    scripts_[first_token] = std::move(tokens);
  }
  void fail_at_step(uint64_t step) { fail_step_ = step; }
  void nan_for(int32_t first_token) { nan_requests_.insert(first_token); }
  void set_step_delay(std::chrono::microseconds delay) { delay_ = delay; }
  // How many layers the observer of execute() hears about (0: none).
  void set_num_layers(int num_layers) { num_layers_ = num_layers; }
  int steps() const { return steps_.load(); }

  int vocab_size() const override { return vocab_size_; }

  Status execute(const ScheduledBatch& batch, std::span<float> logits,
                 const LayerKvWritten& on_layer_written) override {
    steps_.fetch_add(1);
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    if (fail_step_ && batch.step == *fail_step_) return internal_error("injected model failure");
    const size_t vocab = static_cast<size_t>(vocab_size_);
    size_t row = 0;
    for (const ScheduledSequence& entry : batch.entries) {
      if (!entry.samples) continue;
      const Sequence& seq = *entry.sequence;
      std::span<float> out = logits.subspan(row * vocab, vocab);
      std::fill(out.begin(), out.end(), 0.0f);
      const int32_t first = seq.prompt_tokens()[0];
      out[static_cast<size_t>(kFallbackToken)] = kFallbackLogit;
      out[static_cast<size_t>(next_token(first, seq.num_output_tokens()))] = kScriptLogit;
      if (nan_requests_.contains(first)) out[0] = std::numeric_limits<float>::quiet_NaN();
      ++row;
    }
    if (on_layer_written) {
      for (int layer = 0; layer < num_layers_; ++layer) on_layer_written(layer);
    }
    return Status::ok_status();
  }

  int32_t next_token(int32_t first_token, int num_output_tokens) const {
    auto it = scripts_.find(first_token);
    if (it == scripts_.end() || it->second.empty()) return first_token;
    return it->second[static_cast<size_t>(num_output_tokens) % it->second.size()];
  }

 private:
  int vocab_size_;
  std::map<int32_t, std::vector<int32_t>> scripts_;
  std::optional<uint64_t> fail_step_;
  std::set<int32_t> nan_requests_;
  std::chrono::microseconds delay_{0};
  int num_layers_ = 0;
  std::atomic<int> steps_{0};
};

}  // namespace pdserve::testing
