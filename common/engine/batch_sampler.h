// Samples one step's tokens, one per sampling entry of the batch: on the host from the logits
// the executor filled, or, for an executor that samples on its device
// (ModelExecutor::samples_on_device), from the tokens its sample_step() returns. The rows of
// requests with a structured output get their grammar's mask first (forbidden logits set to
// -inf, so logprobs are those of the masked logits, as in vLLM), all rows at once on xgrammar's
// batch matcher (ConstraintBatchMasker), and each sampled token advances its grammar.
// It knows nothing of requests or the scheduler: a failed row is returned as an error for the
// engine to end its request. Used on the engine thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "common/core/status.h"
#include "common/engine/model_executor.h"
#include "common/engine/sequence.h"
#include "common/grammar/constraint.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampler_rng.h"

namespace pdserve {

// One sampling entry of the batch, in entry order.
struct SamplingSlot {
  // Null: the entry's token is not wanted (its request already failed); nothing is drawn.
  const Sequence* sequence = nullptr;
  SamplerRng* rng = nullptr;             // the request's generator
  ConstraintMatcher* grammar = nullptr;  // null: no structured output
};

// One slot's result; nullopt when nothing was drawn for it.
using SlotSample = std::optional<Result<SampleResult>>;

class BatchSampler {
 public:
  // `executor` must outlive the sampler.
  explicit BatchSampler(ModelExecutor& executor);

  // The buffer the step's logits go to: one vocab_size() row per sampling entry, valid until
  // the next call.
  std::span<float> logits(int num_samples);

  // Host path, after execute() filled logits(): each slot's grammar mask, its draw, its grammar
  // advanced over the token. One result per slot.
  std::vector<SlotSample> sample(std::span<const SamplingSlot> slots);

  // Device path. device_rows(): launch_step()'s rows, one per slot (params null for a slot
  // without a sequence). sample_on_device(), after launch_step(): the grammars' masks (computed
  // while the device runs the forward), sample_step(), then each slot's token, logprobs and
  // grammar as the host path gives them; `results` gets one per slot. Returns sample_step()'s
  // error (the batch fails); `results` then holds only the slots whose grammar failed before.
  std::span<const SamplingRow> device_rows(std::span<const SamplingSlot> slots);
  Status sample_on_device(std::span<const SamplingSlot> slots, std::vector<SlotSample>& results);

 private:
  // Applies the grammars of the constrained slots to their logits rows, all at once; one
  // status per slot, ok for the unconstrained ones.
  std::vector<Status> mask_constrained_rows(std::span<const SamplingSlot> slots);
  // One slot, its logits already masked: the draw, the grammar advanced over it.
  Result<SampleResult> sample_slot(const SamplingSlot& slot, std::span<const float> logits);
  // One device row's result as the host sampler would give it: logprobs from its logits row
  // (masked by `allowed`, its grammar's mask), a row left to the host sampled here, outcomes
  // turned into errors.
  Result<SampleResult> device_sample_result(const SamplingRow& row,
                                            std::span<const int32_t> allowed,
                                            const SampledRow& result, std::span<float> logits);
  std::span<float> logits_row(size_t row);

  ModelExecutor& executor_;
  Sampler sampler_;
  ConstraintBatchMasker grammar_masker_;
  std::vector<float> logits_;
  // The device path's rows and grammar masks (one mask row per constrained slot).
  std::vector<SamplingRow> device_rows_;
  std::vector<int32_t> bitmasks_;
};

}  // namespace pdserve
