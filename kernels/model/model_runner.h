// The engine's ModelExecutor for a Qwen3Model on any backend: owns the paged KV pool and the
// forward workspace, turns scheduled entries into SequenceSlices and returns the logits rows
// of the entries that sample. (A whole serving engine is assembled in serving/engine_assembly.h.)
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/engine/model_executor.h"
#include "kernels/model/kv_cache.h"
#include "kernels/model/qwen3_model.h"

namespace pdserve {

struct ModelRunnerConfig {
  int num_blocks = 0;
  int block_size = 16;
  DType kv_dtype = DType::kF32;
  ForwardLimits limits;  // max_num_tokens = the scheduler's max_num_batched_tokens, etc.
};

class Qwen3ModelRunner : public ModelExecutor {
 public:
  // Allocates the KV pool (config.kv_dtype) and the forward workspace.
  // `backend` and `model` must outlive the runner.
  static Result<std::unique_ptr<Qwen3ModelRunner>> create(Backend& backend, Qwen3Model& model,
                                                          const ModelRunnerConfig& config);

  int vocab_size() const override { return model_.config().vocab_size; }
  Status execute(const ScheduledBatch& batch, std::span<float> logits,
                 const LayerKvWritten& on_layer_written) override;

  const KvCache& kv_cache() const { return cache_; }

 private:
  Qwen3ModelRunner(Qwen3Model& model, KvCache cache, ForwardContext context)
      : model_(model), cache_(std::move(cache)), context_(std::move(context)) {}

  Qwen3Model& model_;
  KvCache cache_;
  ForwardContext context_;
  std::vector<SequenceSlice> slices_;
  std::vector<float> all_logits_;  // one row per entry, when some entries do not sample
};


}  // namespace pdserve
