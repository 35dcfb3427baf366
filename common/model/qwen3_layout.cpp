#include "common/model/qwen3_layout.h"

namespace pdserve {

std::vector<TensorSpec> qwen3_tensor_specs(const ModelConfig& config, bool with_lm_head) {
  const int64_t hidden = config.hidden_size;
  const int64_t q_rows = int64_t{config.num_attention_heads} * config.head_dim;
  const int64_t kv_rows = int64_t{config.num_key_value_heads} * config.head_dim;
  const int64_t intermediate = config.intermediate_size;
  const int64_t head_dim = config.head_dim;

  std::vector<TensorSpec> specs;
  specs.reserve(3 + kQwen3TensorsPerLayer * static_cast<size_t>(config.num_hidden_layers));
  specs.push_back({"model.embed_tokens.weight", {config.vocab_size, hidden}});
  for (int layer = 0; layer < config.num_hidden_layers; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    specs.push_back({prefix + "input_layernorm.weight", {hidden}, true});
    specs.push_back({prefix + "self_attn.q_proj.weight", {q_rows, hidden}, false, true});
    specs.push_back({prefix + "self_attn.k_proj.weight", {kv_rows, hidden}, false, true});
    specs.push_back({prefix + "self_attn.v_proj.weight", {kv_rows, hidden}, false, true});
    specs.push_back({prefix + "self_attn.o_proj.weight", {hidden, q_rows}, false, true});
    specs.push_back({prefix + "self_attn.q_norm.weight", {head_dim}, true});
    specs.push_back({prefix + "self_attn.k_norm.weight", {head_dim}, true});
    specs.push_back({prefix + "post_attention_layernorm.weight", {hidden}, true});
    specs.push_back({prefix + "mlp.gate_proj.weight", {intermediate, hidden}, false, true});
    specs.push_back({prefix + "mlp.up_proj.weight", {intermediate, hidden}, false, true});
    specs.push_back({prefix + "mlp.down_proj.weight", {hidden, intermediate}, false, true});
  }
  specs.push_back({"model.norm.weight", {hidden}, true});
  if (with_lm_head) specs.push_back({kLmHeadName, {config.vocab_size, hidden}});
  return specs;
}

}  // namespace pdserve
