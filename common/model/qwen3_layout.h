// The tensors of a Qwen3 dense checkpoint (Hugging Face names) and their shapes, derived from
// the config. The one place that knows the layout: the loader and the synthetic checkpoint
// writer both use it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/model/model_config.h"

namespace pdserve {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool is_norm = false;    // RMSNorm weight (initialised near 1)
  bool is_linear = false;  // a decoder layer's projection (the weights FP8 checkpoints quantize)
};

inline constexpr const char* kLmHeadName = "lm_head.weight";
// Tensors per decoder layer, in the order qwen3_tensor_specs lists them: input_layernorm,
// q_proj, k_proj, v_proj, o_proj, q_norm, k_norm, post_attention_layernorm, gate_proj,
// up_proj, down_proj.
inline constexpr size_t kQwen3TensorsPerLayer = 11;

// model.embed_tokens, then each layer's tensors in the order above, then model.norm, then
// lm_head when `with_lm_head`.
std::vector<TensorSpec> qwen3_tensor_specs(const ModelConfig& config, bool with_lm_head);

}  // namespace pdserve
