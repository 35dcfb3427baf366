// How a GPU node divides device memory: weights, forward workspace, and the KV pool taking
// what remains of --gpu-memory-utilization (vLLM's meaning: the fraction of the device's
// total memory this process may use, counting what other processes already hold). Pure
// arithmetic, so it is tested without a GPU. Qwen3ModelRunner measures rather than estimates:
// it loads the weights, allocates the workspace, captures the decode graphs and runs one
// profiling step at max_num_batched_tokens on a small temporary pool, then reads the free
// memory (free_bytes, with weight_bytes = workspace_bytes = 0 and the temporary pool as
// profiling_pool_bytes).
#pragma once

#include <cstddef>

#include "common/core/dtype.h"
#include "common/core/status.h"
#include "common/model/model_config.h"
#include "kernels/model/qwen3_model.h"

namespace pdserve {

inline constexpr double kDefaultGpuMemoryUtilization = 0.90;

// A speculative-decoding draft model on the same device (docs/SPECULATIVE_DRAFT.md): its
// weights and workspace are allocated after the target's pool, and its KV pool holds as many
// tokens as the target's, so the budget pays a fixed part and a part per target block.
struct DraftMemory {
  size_t fixed_bytes = 0;         // the draft's weights and forward workspace
  size_t kv_bytes_per_block = 0;  // the draft's KV for one target block's tokens
};

struct GpuMemoryInputs {
  size_t total_bytes = 0;  // the device's memory
  size_t free_bytes = 0;   // free now
  // Allocations still to come besides the KV pool (0 when measured after them).
  size_t weight_bytes = 0;     // the model's weights as placed on the device
  size_t workspace_bytes = 0;  // forward workspace, cuBLAS and graph memory
  // Held now but released before the KV pool is allocated (the profiling step's pool).
  size_t profiling_pool_bytes = 0;
  double utilization = kDefaultGpuMemoryUtilization;
  size_t kv_bytes_per_block = 0;  // K and V of one block across all layers
  int blocks_per_sequence = 0;    // blocks one sequence of max_model_len needs
  int reserved_blocks = 0;        // blocks no sequence gets (the decode graphs' scratch block)
  DraftMemory draft;              // all zero without a draft model
};

struct GpuMemoryPlan {
  size_t budget_bytes = 0;           // total * utilization
  size_t other_processes_bytes = 0;  // in use now and kept: total - free - profiling pool
  size_t kv_bytes = 0;               // the target's pool
  size_t draft_bytes = 0;            // the draft's weights, workspace and a pool of num_blocks
  int num_blocks = 0;  // the pool's, reserved blocks included
};

// InvalidArgument naming --gpu-memory-utilization unless `utilization` is in (0, 1].
Status check_gpu_memory_utilization(double utilization);

// InvalidArgument for a utilization outside (0, 1] or inconsistent inputs; ResourceExhausted
// when the weights and workspace do not fit the budget ("model does not fit") or the rest
// holds fewer blocks than one max_model_len sequence needs besides the reserved ones.
// Messages give the GiB figures.
Result<GpuMemoryPlan> plan_gpu_memory(const GpuMemoryInputs& inputs);

// What a draft model of `draft`'s shape will take on the device: weights in `weight_dtype`,
// a workspace for `limits` (max_model_len capped at the draft's max_position_embeddings, as
// the proposer does) and KV in `kv_dtype`, per target block of `block_size` tokens.
DraftMemory draft_memory(const ModelConfig& draft, DType weight_dtype, DType kv_dtype,
                         ForwardLimits limits, int block_size);

// Bytes of a Qwen3 model's weights in `dtype` (tied embeddings counted once); an FP8 model's
// projections (config.quantization) at one byte a weight plus their float32 scales.
size_t qwen3_weight_bytes(const ModelConfig& config, DType dtype);

// Bytes ForwardContext::create allocates for these limits with `activation` activations.
size_t forward_workspace_bytes(const ModelConfig& config, const ForwardLimits& limits,
                               int block_size, DType activation);

}  // namespace pdserve
