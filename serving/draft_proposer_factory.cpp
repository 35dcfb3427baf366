#include "serving/draft_proposer_factory.h"

#include <algorithm>

#include "kernels/model/draft_model_load.h"

namespace pdserve {

Result<DraftMemory> draft_device_memory(const std::string& model, const Backend& backend,
                                        const EngineConfig& engine, const ForwardLimits& limits) {
  PDS_ASSIGN_OR_RETURN(const ModelConfig draft, read_draft_model_config(model));
  // As load_draft_model places it on a device, and as DraftModelProposer sizes its pool.
  const DType weights = backend.activation_dtype();
  const DType kv = engine.kv_cache_dtype.value_or(backend.default_kv_dtype(weights));
  return draft_memory(draft, weights, kv, limits, engine.block_size);
}

Result<DraftModelProposerConfig> draft_proposer_config(const LoadedModel& target,
                                                       const EngineConfig& engine,
                                                       const DraftProposerSettings& settings) {
  const int pool_tokens = settings.draft_pool_tokens.value_or(settings.target_pool_tokens);
  if (engine.block_size < 1 || pool_tokens < engine.block_size) {
    return invalid_argument("draft model: a KV pool of " + std::to_string(pool_tokens) +
                            " tokens holds no block of " + std::to_string(engine.block_size));
  }
  const ModelConfig& target_config = target.model->config();
  DraftModelProposerConfig config;
  config.model = settings.model;
  config.num_speculative_tokens = settings.num_speculative_tokens;
  config.num_blocks = pool_tokens / engine.block_size;
  config.block_size = engine.block_size;
  // The target's weight dtype on the host (a device backend uses its activation dtype anyway),
  // and the target's KV dtype (unset: the backend's default for those weights, as the target's).
  config.dtype = target.model->weight_dtype();
  config.kv_cache_dtype = engine.kv_cache_dtype;
  config.limits.max_num_tokens = engine.max_num_batched_tokens;
  config.limits.max_num_seqs = engine.max_num_seqs;
  config.limits.max_model_len =
      engine.max_model_len > 0 ? engine.max_model_len : target_config.max_position_embeddings;
  config.target_vocab_size = target_config.vocab_size;
  config.target_model_dir = target.model_dir;
  return config;
}

}  // namespace pdserve
