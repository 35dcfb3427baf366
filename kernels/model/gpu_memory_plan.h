// How a GPU node divides device memory: weights, forward workspace, and the KV pool taking
// what remains of --gpu-memory-utilization (vLLM's meaning: the fraction of the device's
// total memory this process may use, counting what other processes already hold). Pure
// arithmetic, so it is tested without a GPU.
#pragma once

#include <cstddef>

#include "common/core/dtype.h"
#include "common/core/status.h"
#include "common/model/model_config.h"
#include "kernels/model/qwen3_model.h"

namespace pdserve {

inline constexpr double kDefaultGpuMemoryUtilization = 0.90;

struct GpuMemoryInputs {
  size_t total_bytes = 0;      // the device's memory
  size_t free_bytes = 0;       // free at startup, before this process allocated anything
  size_t weight_bytes = 0;     // the model's weights as placed on the device
  size_t workspace_bytes = 0;  // forward workspace, cuBLAS and graph memory
  double utilization = kDefaultGpuMemoryUtilization;
  size_t kv_bytes_per_block = 0;  // K and V of one block across all layers
  int blocks_per_sequence = 0;    // blocks one sequence of max_model_len needs
};

struct GpuMemoryPlan {
  size_t budget_bytes = 0;           // total * utilization
  size_t other_processes_bytes = 0;  // total - free at startup
  size_t kv_bytes = 0;
  int num_blocks = 0;
};

// InvalidArgument for a utilization outside (0, 1] or inconsistent inputs; ResourceExhausted
// when the weights and workspace do not fit the budget ("model does not fit") or the rest
// holds fewer blocks than one max_model_len sequence needs. Messages give the GiB figures.
Result<GpuMemoryPlan> plan_gpu_memory(const GpuMemoryInputs& inputs);

// Bytes of a Qwen3 model's weights in `dtype` (tied embeddings counted once).
size_t qwen3_weight_bytes(const ModelConfig& config, DType dtype);

// Bytes ForwardContext::create allocates for these limits with `activation` activations.
size_t forward_workspace_bytes(const ModelConfig& config, const ForwardLimits& limits,
                               int block_size, DType activation);

}  // namespace pdserve
