// Qwen3 dense weights on the host, in one compute dtype, with every shape checked against the
// config. This is the contract the model runner consumes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/core/dtype.h"
#include "common/core/status.h"
#include "common/model/checkpoint.h"
#include "common/model/model_config.h"

namespace pdserve {

// A host tensor: a non-owning view of contiguous row-major data plus a keep-alive handle
// (the mmap of its shard, or an owned buffer after dtype conversion).
//
// An FP8 linear weight (dtype kF8E4M3, shape {n, k}) also carries its dequantization
// multipliers (the checkpoint's weight_scale_inv or weight_scale, as float32): one per block of
// scale_block_n x scale_block_k elements (128 x 128 for Qwen's block format, n x k for a
// per-tensor scale, 1 x k per channel), row-major [ceil(n/scale_block_n), ceil(k/scale_block_k)].
// Element (i, j) means fp8_e4m3_to_float(w[i*k + j]) *
// scale[(i / scale_block_n) * ceil(k / scale_block_k) + j / scale_block_k].
// Other tensors have no scale (null, blocks 0).
struct HostTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  std::shared_ptr<const void> keep_alive;
  const float* scale = nullptr;
  int64_t scale_block_n = 0;
  int64_t scale_block_k = 0;
  std::shared_ptr<const void> scale_keep_alive;
  int64_t numel() const;
  size_t nbytes() const;  // the data's bytes, scales excluded
  // Elements of the scale array (0 without one).
  int64_t scale_count() const;
  template <typename T>
  const T* data_as() const {
    return reinterpret_cast<const T*>(data);
  }
};

struct Qwen3LayerWeights {
  HostTensor input_layernorm;           // [hidden]
  HostTensor q_proj, k_proj, v_proj;    // [heads*head_dim, hidden], [kv_heads*head_dim, hidden] x2
  HostTensor o_proj;                    // [hidden, heads*head_dim]
  HostTensor q_norm, k_norm;            // [head_dim]
  HostTensor post_attention_layernorm;  // [hidden]
  HostTensor gate_proj, up_proj;        // [intermediate, hidden]
  HostTensor down_proj;                 // [hidden, intermediate]
};

struct Qwen3Weights {
  ModelConfig config;
  HostTensor embed_tokens;  // [vocab, hidden]
  std::vector<Qwen3LayerWeights> layers;
  HostTensor final_norm;  // model.norm.weight [hidden]
  HostTensor lm_head;     // [vocab, hidden]; shares embed_tokens' data when tied and absent
};

// Where the weights live once loaded.
enum class WeightPlacement {
  // A view into the checkpoint's mmap where the file already has the compute dtype and the
  // data is aligned for it: nothing copied. For a backend that uploads them to its own memory.
  kMapWhereTheFileAllows,
  // Every tensor in memory of its own on transparent huge pages (allocate_host_buffer): for a
  // backend that computes on the host. Streaming weights through 4 KiB pages of the page
  // cache costs decode batch 1 up to a third of its speed (docs/PERF.md, the TLB).
  kHostHugePages,
};

// Every tensor converted to `compute_dtype` (placed as `placement` says; a conversion or copy
// is multithreaded), except the FP8 linear weights of a checkpoint with a quantization_config:
// they stay 1-byte F8_E4M3 (mapped or copied, never expanded) with float32 scales
// (common/model/fp8_weight_scales.h says which scale layouts load and what is refused),
// every shape checked against the config (error names the tensor, expected and actual shape),
// unexpected or missing tensors reported by name. Tied embeddings: lm_head.weight may be
// present (shape-checked; lm_head then shares embed_tokens' data, as transformers ties them)
// or absent; untied models must have it.
Result<Qwen3Weights> load_qwen3_weights(
    const Checkpoint& checkpoint, DType compute_dtype,
    WeightPlacement placement = WeightPlacement::kMapWhereTheFileAllows);

}  // namespace pdserve
