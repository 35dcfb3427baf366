#include "kernels/model/model_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

namespace pdserve {

Result<std::unique_ptr<Qwen3ModelRunner>> Qwen3ModelRunner::create(
    Backend& backend, Qwen3Model& model, const ModelRunnerConfig& config) {
  if (config.num_blocks < 1 || config.block_size < 1) {
    return invalid_argument("model runner: num_blocks and block_size must be >= 1, got " +
                            std::to_string(config.num_blocks) + " and " +
                            std::to_string(config.block_size));
  }
  PDS_ASSIGN_OR_RETURN(
      KvCache cache,
      KvCache::create(backend, kv_layout_for(model.config(), config.num_blocks,
                                                  config.block_size, config.kv_dtype)));
  PDS_ASSIGN_OR_RETURN(
      ForwardContext context,
      ForwardContext::create(backend, model.config(), config.limits, config.block_size));
  return std::unique_ptr<Qwen3ModelRunner>(
      new Qwen3ModelRunner(model, std::move(cache), std::move(context)));
}

Status Qwen3ModelRunner::execute(const ScheduledBatch& batch, std::span<float> logits,
                                 const LayerKvWritten& on_layer_written) {
  const size_t vocab = static_cast<size_t>(vocab_size());
  const size_t num_samples = static_cast<size_t>(batch.num_samples);
  if (logits.size() < num_samples * vocab) {
    return invalid_argument("model runner: the logits buffer holds " +
                            std::to_string(logits.size()) + " floats, step " +
                            std::to_string(batch.step) + " needs " +
                            std::to_string(num_samples * vocab));
  }
  if (batch.empty()) return Status::ok_status();
  slices_.clear();
  for (const ScheduledSequence& entry : batch.entries) {
    slices_.push_back({entry.new_tokens(), entry.num_cached_before, entry.block_table});
  }
  // The model returns one row per slice; when every entry samples those are the rows wanted.
  if (num_samples == slices_.size()) {
    return model_.forward(slices_, cache_, context_, logits, on_layer_written);
  }
  all_logits_.resize(slices_.size() * vocab);
  PDS_RETURN_IF_ERROR(model_.forward(slices_, cache_, context_, all_logits_, on_layer_written));
  size_t row = 0;
  for (size_t i = 0; i < batch.entries.size(); ++i) {
    if (!batch.entries[i].samples) continue;
    std::memcpy(logits.data() + row * vocab, all_logits_.data() + i * vocab, vocab * sizeof(float));
    ++row;
  }
  return Status::ok_status();
}

}  // namespace pdserve
