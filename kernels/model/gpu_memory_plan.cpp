#include "kernels/model/gpu_memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "kernels/model/kv_cache.h"

namespace pdserve {
namespace {

std::string gib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  return text;
}

}  // namespace

Status check_gpu_memory_utilization(double utilization) {
  if (utilization > 0.0 && utilization <= 1.0) return {};
  return invalid_argument("--gpu-memory-utilization must be in (0, 1], got " +
                          std::to_string(utilization));
}

Result<GpuMemoryPlan> plan_gpu_memory(const GpuMemoryInputs& in) {
  PDS_RETURN_IF_ERROR(check_gpu_memory_utilization(in.utilization));
  if (in.total_bytes == 0 || in.free_bytes > in.total_bytes || in.kv_bytes_per_block == 0 ||
      in.blocks_per_sequence <= 0 || in.reserved_blocks < 0 ||
      in.profiling_pool_bytes > in.total_bytes - in.free_bytes) {
    return invalid_argument("GPU memory plan: inconsistent inputs (total " + gib(in.total_bytes) +
                            ", free " + gib(in.free_bytes) + ", profiling pool " +
                            gib(in.profiling_pool_bytes) + ")");
  }
  GpuMemoryPlan plan;
  plan.budget_bytes =
      static_cast<size_t>(std::floor(static_cast<double>(in.total_bytes) * in.utilization));
  plan.other_processes_bytes = in.total_bytes - in.free_bytes - in.profiling_pool_bytes;
  const size_t needed =
      plan.other_processes_bytes + in.weight_bytes + in.workspace_bytes + in.draft.fixed_bytes;
  if (needed >= plan.budget_bytes) {
    std::string parts;
    if (in.weight_bytes > 0) parts += "weights " + gib(in.weight_bytes) + " + ";
    if (in.workspace_bytes > 0) parts += "workspace " + gib(in.workspace_bytes) + " + ";
    if (in.draft.fixed_bytes > 0) {
      parts += "draft model " + gib(in.draft.fixed_bytes) + " + ";
    }
    return resource_exhausted("model does not fit: " + parts + "memory in use " +
                              gib(plan.other_processes_bytes) + " exceed the budget of " +
                              gib(plan.budget_bytes) + " (--gpu-memory-utilization " +
                              std::to_string(in.utilization) + " of " + gib(in.total_bytes) + ")");
  }
  // Every target block brings the draft's KV for the same tokens.
  const size_t blocks =
      (plan.budget_bytes - needed) / (in.kv_bytes_per_block + in.draft.kv_bytes_per_block);
  const size_t blocks_needed =
      static_cast<size_t>(in.blocks_per_sequence) + static_cast<size_t>(in.reserved_blocks);
  if (blocks < blocks_needed) {
    return resource_exhausted(
        "no room for one sequence: " + gib(plan.budget_bytes - needed) + " left for the KV cache " +
        "hold " + std::to_string(blocks) + " blocks, one max_model_len sequence needs " +
        std::to_string(in.blocks_per_sequence) +
        (in.reserved_blocks > 0 ? " and " + std::to_string(in.reserved_blocks) + " are reserved"
                                : std::string()) +
        " (raise --gpu-memory-utilization or lower --max-model-len)");
  }
  plan.num_blocks = static_cast<int>(std::min<size_t>(blocks, 0x7fffffff));
  plan.kv_bytes = static_cast<size_t>(plan.num_blocks) * in.kv_bytes_per_block;
  plan.draft_bytes =
      in.draft.fixed_bytes + static_cast<size_t>(plan.num_blocks) * in.draft.kv_bytes_per_block;
  return plan;
}

DraftMemory draft_memory(const ModelConfig& draft, DType weight_dtype, DType kv_dtype,
                         ForwardLimits limits, int block_size) {
  limits.max_model_len = std::min(limits.max_model_len, draft.max_position_embeddings);
  DraftMemory memory;
  memory.fixed_bytes = qwen3_weight_bytes(draft, weight_dtype) +
                       forward_workspace_bytes(draft, limits, block_size, weight_dtype);
  memory.kv_bytes_per_block = kv_layout_for(draft, 1, block_size, kv_dtype).total_bytes();
  return memory;
}

size_t qwen3_weight_bytes(const ModelConfig& c, DType dtype) {
  const size_t hidden = static_cast<size_t>(c.hidden_size);
  const size_t q_width = static_cast<size_t>(c.num_attention_heads) * c.head_dim;
  const size_t kv_width = static_cast<size_t>(c.num_key_value_heads) * c.head_dim;
  const size_t inter = static_cast<size_t>(c.intermediate_size);
  const size_t norms = 2 * hidden                              // the two layer norms
                       + 2 * static_cast<size_t>(c.head_dim);  // q_norm, k_norm
  // {rows, cols} of each projection of a layer.
  const std::pair<size_t, size_t> projections[] = {{q_width, hidden}, {hidden, q_width},
                                                   {kv_width, hidden}, {kv_width, hidden},
                                                   {inter, hidden},   {inter, hidden},
                                                   {hidden, inter}};
  size_t linear_bytes = 0;
  for (const auto& [rows, cols] : projections) {
    if (!c.quantization) {
      linear_bytes += rows * cols * dtype_size(dtype);
      continue;
    }
    // FP8: one byte a weight plus float32 scales (per block, else at most one per row).
    const size_t block_n = static_cast<size_t>(c.quantization->block_n.value_or(1));
    const size_t block_k = static_cast<size_t>(c.quantization->block_k.value_or(
        static_cast<int64_t>(cols)));
    linear_bytes += rows * cols +
                    (rows + block_n - 1) / block_n * ((cols + block_k - 1) / block_k) * sizeof(float);
  }
  const size_t embeddings = static_cast<size_t>(c.vocab_size) * hidden;
  const size_t elements = embeddings * (c.tie_word_embeddings ? 1 : 2) + hidden +
                          norms * static_cast<size_t>(c.num_hidden_layers);
  return elements * dtype_size(dtype) + linear_bytes * static_cast<size_t>(c.num_hidden_layers);
}

size_t forward_workspace_bytes(const ModelConfig& c, const ForwardLimits& limits, int block_size,
                               DType activation) {
  const size_t tokens = static_cast<size_t>(limits.max_num_tokens);
  const size_t seqs = static_cast<size_t>(limits.max_num_seqs);
  const size_t q_width = static_cast<size_t>(c.num_attention_heads) * c.head_dim;
  const size_t kv_width = static_cast<size_t>(c.num_key_value_heads) * c.head_dim;
  const size_t hidden = static_cast<size_t>(c.hidden_size);
  const size_t inter = static_cast<size_t>(c.intermediate_size);
  const size_t blocks_per_seq =
      (static_cast<size_t>(limits.max_model_len) + block_size - 1) / block_size;
  // hidden, residual, qkv, attention_out, gate_up, mlp_act, last_hidden (activations)
  const size_t activations =
      tokens * (2 * hidden + q_width + 2 * kv_width + q_width + 3 * inter) + seqs * hidden;
  const size_t logits = seqs * static_cast<size_t>(c.vocab_size) * sizeof(float);
  return activations * dtype_size(activation) + logits +
         packed_batch_capacity_bytes(limits, static_cast<int>(blocks_per_seq));
}

}  // namespace pdserve
