// Assembles a serving engine for a loaded model from a node's settings (the serving binaries'
// flags): the KV pool sized by its memory budget, the scheduler, the model runner, on a
// disaggregated node the KV connector over the pool, and the lower KV tiers when asked for
// (their keys reach the heartbeats through LlmEngine::tiered_key_source()).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/engine/kv_connector.h"
#include "common/engine/llm_engine.h"
#include "common/engine/spec_decode/speculative_config.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/model/gpu_memory_plan.h"
#include "kernels/model/kv_cache.h"
#include "kernels/model/model_loader.h"

namespace pdserve {

inline constexpr double kDefaultCpuKvCacheMemoryGib = 4.0;

// Serving settings of one node (the command-line flags of the serving binaries).
struct EngineConfig {
  std::string served_model_name;  // empty: the hub id given to --model, else the folder's name
  // The KV pool's memory. Unset: kDefaultCpuKvCacheMemoryGib on the CPU; on CUDA the pool takes
  // what gpu_memory_utilization leaves (set on CUDA: exactly this much, as vLLM's
  // --kv-cache-memory overrides its utilization).
  std::optional<double> kv_cache_memory_gib;
  // CUDA: the fraction of the device's total memory this node may use (vLLM's meaning).
  double gpu_memory_utilization = kDefaultGpuMemoryUtilization;
  int block_size = 16;
  int max_num_batched_tokens = 2048;
  int max_num_seqs = 128;
  int max_num_waiting = 1024;
  int max_model_len = 0;  // 0: the model's max_position_embeddings
  // KV pool element type; unset: the backend's activation dtype (float32 on the CPU, exact
  // against the reference). bfloat16 halves the pool's memory and attention traffic.
  std::optional<DType> kv_cache_dtype;
  // Speculative decoding (--speculative-config on pdserve-decode; never on a prefill node).
  std::optional<SpeculativeConfig> speculative;
  // Lower KV tiers (issue #32, kv_tiers/): host memory for prefix-cache blocks evicted from the
  // pool (0: no tiers), and below it a disk folder with its byte budget (empty: none).
  double kv_offload_host_gib = 0;
  std::string kv_offload_disk_dir;
  double kv_offload_disk_gib = 0;
  KvTierPolicy kv_tier_policy;
};

// Builds a disaggregated node's KV connector over the engine's pool (which outlives it).
using KvConnectorFactory = std::function<Result<std::unique_ptr<KvConnector>>(const KvCache& pool)>;

// The KV pool takes as many blocks as kv_cache_memory_gib holds, or on CUDA (without it) what
// gpu_memory_utilization leaves after a profiling step (Qwen3ModelRunner; the figures are
// logged). On CUDA one block is held back from the scheduler for the decode graphs.
// InvalidArgument for settings out of range, ResourceExhausted when the budget holds no
// block, the model does not fit or the backend cannot allocate the pool; InvalidArgument for a
// KV tier setting out of range or a disk tier folder that is missing or not writable. `model` must
// outlive the engine, which is returned not yet started.
Result<std::unique_ptr<LlmEngine>> make_llm_engine(
    LoadedModel& model, Tokenizer tokenizer, const EngineConfig& config,
    const KvConnectorFactory& connector_factory = {});

}  // namespace pdserve
