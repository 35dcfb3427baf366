// What the engine needs from a model: one forward step over a scheduled batch, returning the
// logits the sampler draws from, or, for an executor that samples on its device, the sampled
// tokens. An interface so that common/ stays free of kernels and CUDA (the real runner is
// kernels/model/model_runner.h) and so that tests can run the engine on a scripted model.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "common/core/status.h"
#include "common/engine/scheduler.h"
#include "common/sampling/sampler_rng.h"
#include "common/sampling/sampling_params.h"

namespace pdserve {

// Told during a forward that layer `layer` (0, 1, ... in order) has written the KV of every
// entry's new tokens: a prefill node starts sending that layer while the next ones compute
// (layer-by-layer KV transfer). Empty: nobody listens.
using LayerKvWritten = std::function<void(int layer)>;

// One sampling entry of a step, for an executor that samples on its device: what
// common/sampling/sampler.h's Sampler::sample takes, and the request's generator. The spans
// stay valid until sample_step() returns.
struct SamplingRow {
  // Null: the entry's token is not wanted (its request already failed); nothing is drawn for
  // it and its result is ignored.
  const SamplingParams* params = nullptr;
  std::span<const int32_t> prompt_tokens;
  std::span<const int32_t> output_tokens;
  std::span<const int32_t> banned_token_ids;
  // The request's generator. The executor draws u = rng->next_unit() exactly when the host
  // sampler would (sampler_draws(*params, output_tokens.size())) and samples with that u, so
  // the generator's state after the step is the host path's.
  SamplerRng* rng = nullptr;
};

enum class SampleOutcome : uint8_t {
  kSampled,          // `token` is the sampled id
  kLeftToHost,       // not sampled (its inputs exceed the device's buffers) and nothing drawn:
                     // its raw logits row is returned for the host sampler
  kInvalidLogits,    // a NaN or +inf logit
  kAllMasked,        // every logit is -inf after masking
  kPenaltyOverflow,  // a penalty overflowed a logit to +inf
};

struct SampledRow {
  SampleOutcome outcome = SampleOutcome::kSampled;
  int32_t token = 0;
};

class ModelExecutor {
 public:
  virtual ~ModelExecutor() = default;

  virtual int vocab_size() const = 0;

  // Makes the calling thread use the executor's device (cudaSetDevice on CUDA). The engine
  // thread calls it once before its first step; a failure stops the engine from starting.
  virtual Status bind_current_thread() { return Status::ok_status(); }

  // Computes every entry's new tokens (writing their KV) and fills one row of vocab_size()
  // float logits per entry with `samples` set, in entry order, into `logits` (at least
  // batch.num_samples * vocab_size() floats). An error fails every request of the batch.
  // `on_layer_written`, when set, is called once per layer, in order, before execute returns.
  virtual Status execute(const ScheduledBatch& batch, std::span<float> logits,
                         const LayerKvWritten& on_layer_written) = 0;

  // Executors that sample on their device run a step in two calls instead of execute(), so
  // that only token ids come back and the host computes the grammars' masks while the device
  // computes. launch_step() takes one row per sampling entry (rows[i] for the i-th entry with
  // `samples`, in entry order), draws their u, sends the step's inputs up and queues the
  // forward and returns. sample_step() takes the structured outputs' allowed tokens
  // (allowed_tokens[i]: bit t % 32 of word t / 32, ceil(vocab / 32) words; empty: row i has
  // none), which are applied before everything else as the host path masks the logits;
  // samples every row by the semantics of common/sampling/sampler.h; waits for the step once
  // and fills results[i]. The raw logits row of entry i (before any mask) is copied to
  // logits[i * vocab_size(), ...) only when rows[i].params->want_logprobs or the row is
  // kLeftToHost; the others are left alone. `on_layer_written` is called for every layer
  // before sample_step() returns. An error of either call fails every request of the batch.
  // Unimplemented unless samples_on_device().
  virtual bool samples_on_device() const { return false; }
  virtual Status launch_step(const ScheduledBatch& /*batch*/, std::span<const SamplingRow> /*rows*/,
                             const LayerKvWritten& /*on_layer_written*/) {
    return unimplemented("this model executor does not sample on a device");
  }
  virtual Status sample_step(std::span<const std::span<const int32_t>> /*allowed_tokens*/,
                             std::span<SampledRow> /*results*/, std::span<float> /*logits*/) {
    return unimplemented("this model executor does not sample on a device");
  }

  // Prompt logprobs (SamplingParams::prompt_logprobs): after a step's execute() or
  // sample_step() and before the next step, token_logits() fills one vocab_size() row of float
  // logits per new token [first, first + count) of batch entry `entry` (0 <= first, first +
  // count <= its num_new_tokens, count <= max_token_logits()), into `logits`. Only the requests
  // that ask pay for these rows. An executor whose max_token_logits() is 0 computes none: the
  // engine refuses requests that want them.
  virtual int max_token_logits() const { return 0; }
  virtual Status token_logits(int /*entry*/, int /*first*/, int /*count*/,
                              std::span<float> /*logits*/) {
    return unimplemented("this model executor does not compute prompt logits");
  }
};

}  // namespace pdserve
