// What the engine needs from a model: one forward step over a scheduled batch, returning the
// logits the sampler draws from. An interface so that common/ stays free of kernels and CUDA
// (the real runner is kernels/model/model_runner.h) and so that tests can run the engine on a
// scripted model.
#pragma once

#include <functional>
#include <span>

#include "common/core/status.h"
#include "common/engine/scheduler.h"

namespace pdserve {

// Told during a forward that layer `layer` (0, 1, ... in order) has written the KV of every
// entry's new tokens: a prefill node starts sending that layer while the next ones compute
// (layer-by-layer KV transfer). Empty: nobody listens.
using LayerKvWritten = std::function<void(int layer)>;

class ModelExecutor {
 public:
  virtual ~ModelExecutor() = default;

  virtual int vocab_size() const = 0;

  // Computes every entry's new tokens (writing their KV) and fills one row of vocab_size()
  // float logits per entry with `samples` set, in entry order, into `logits` (at least
  // batch.num_samples * vocab_size() floats). An error fails every request of the batch.
  // `on_layer_written`, when set, is called once per layer, in order, before execute returns.
  virtual Status execute(const ScheduledBatch& batch, std::span<float> logits,
                         const LayerKvWritten& on_layer_written) = 0;
};

}  // namespace pdserve
