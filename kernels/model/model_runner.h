// The engine's ModelExecutor for a Qwen3Model on any backend: owns the paged KV pool and the
// forward workspace, turns scheduled entries into SequenceSlices and returns the logits rows
// of the entries that sample. Plus make_llm_engine(), which builds a whole serving engine for
// a loaded model.
#pragma once

#include <optional>

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/engine/kv_connector.h"
#include "common/engine/llm_engine.h"
#include "common/engine/model_executor.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/model/kv_cache.h"
#include "kernels/model/model_loader.h"
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

// Serving settings of one node (the command-line flags of the serving binaries).
struct EngineConfig {
  std::string served_model_name;  // empty: the model folder's name
  double kv_cache_memory_gib = 4.0;
  int block_size = 16;
  int max_num_batched_tokens = 2048;
  int max_num_seqs = 128;
  int max_num_waiting = 1024;
  int max_model_len = 0;  // 0: the model's max_position_embeddings
  // KV pool element type; unset: the backend's activation dtype (float32 on the CPU, exact
  // against the reference). bfloat16 halves the pool's memory and attention traffic.
  std::optional<DType> kv_cache_dtype;
};

// Builds a disaggregated node's KV connector over the engine's pool (which outlives it).
using KvConnectorFactory = std::function<Result<std::unique_ptr<KvConnector>>(const KvCache& pool)>;

// The KV pool takes as many blocks as kv_cache_memory_gib holds. InvalidArgument for
// settings out of range, ResourceExhausted when the budget holds no block or the backend
// cannot allocate it. `model` must outlive the engine, which is returned not yet started.
Result<std::unique_ptr<LlmEngine>> make_llm_engine(
    LoadedModel& model, Tokenizer tokenizer, const EngineConfig& config,
    const KvConnectorFactory& connector_factory = {});

}  // namespace pdserve
