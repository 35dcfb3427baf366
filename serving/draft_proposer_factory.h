// The draft-model proposer of a serving engine (speculative decoding, issue #30): maps a node's
// settings and its target model to kernels/model/draft_model_proposer.h's config, which
// serving/engine_assembly hands to kernels/model/proposer_factory.h's make_proposer. The draft
// runs on the target's backend, in its weight dtype, with the engine's block size, KV dtype and
// step limits, and a KV pool holding as many tokens as the target's (so every sequence the
// target holds can be drafted for), unless draft_pool_tokens says otherwise.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "kernels/model/draft_model_proposer.h"
#include "kernels/model/gpu_memory_plan.h"
#include "kernels/model/model_loader.h"
#include "serving/engine_assembly.h"

namespace pdserve {

struct DraftProposerSettings {
  std::string model;                     // --speculative-config's "model"
  int num_speculative_tokens = 0;        // its "num_speculative_tokens"
  int target_pool_tokens = 0;            // the target's KV pool: blocks x block size
  std::optional<int> draft_pool_tokens;  // unset: target_pool_tokens
};

// What the draft model `model` will take on `backend` (a device: weights in its activation
// dtype, KV in the engine's --kv-cache-dtype or the backend's default), for a target pool sized
// by --gpu-memory-utilization to leave room for it. The loader's errors, naming the draft.
Result<DraftMemory> draft_device_memory(const std::string& model, const Backend& backend,
                                        const EngineConfig& engine, const ForwardLimits& limits);

// InvalidArgument when a pool size is below one block.
Result<DraftModelProposerConfig> draft_proposer_config(const LoadedModel& target,
                                                       const EngineConfig& engine,
                                                       const DraftProposerSettings& settings);

}  // namespace pdserve
