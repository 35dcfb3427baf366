// What the engine needs from a model: one forward step over a scheduled batch, returning the
// logits the sampler draws from. An interface so that common/ stays free of kernels and CUDA
// (the real runner is kernels/model/model_runner.h) and so that tests can run the engine on a
// scripted model.
#pragma once

#include <span>

#include "common/core/status.h"
#include "common/engine/scheduler.h"

namespace pdserve {

class ModelExecutor {
 public:
  virtual ~ModelExecutor() = default;

  virtual int vocab_size() const = 0;

  // Computes every entry's new tokens (writing their KV) and fills one row of vocab_size()
  // float logits per entry with `samples` set, in entry order, into `logits` (at least
  // batch.num_samples * vocab_size() floats). An error fails every request of the batch.
  virtual Status execute(const ScheduledBatch& batch, std::span<float> logits) = 0;
};

}  // namespace pdserve
