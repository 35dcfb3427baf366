// The parts of a Hugging Face config.json that a Qwen3 dense model needs, validated.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/core/dtype.h"
#include "common/core/status.h"
#include "common/model/quantization_config.h"

namespace pdserve {

struct ModelConfig {
  std::string architecture;
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  float rms_norm_eps = 0.0f;
  double rope_theta = 0.0;
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  DType torch_dtype = DType::kF32;
  std::optional<int> bos_token_id;
  std::vector<int> eos_token_ids;
  // Set for an FP8 checkpoint (quantization_config); its linear weights are then F8_E4M3
  // with scale tensors (common/model/qwen3_weights.h).
  std::optional<Fp8WeightQuantization> quantization;
};

// Reads and validates `path`. Refuses architectures other than Qwen3ForCausalLM and features
// we do not implement (hidden_act other than silu, attention_bias, rope_scaling, sliding
// window) and quantization formats other than FP8 (quantization_config.h). Every error names
// the file and the key.
Result<ModelConfig> load_model_config(const std::filesystem::path& path);

// Same validation for an already parsed JSON object; `source` names it in errors.
Result<ModelConfig> parse_model_config(const nlohmann::json& json, const std::string& source);

}  // namespace pdserve
