#include "common/model/model_config.h"

#include "common/core/files.h"
#include "common/model/json_fields.h"

namespace pdserve {
namespace {

constexpr const char* kSupportedArchitecture = "Qwen3ForCausalLM";

using json_fields::fail;
using json_fields::Source;

int positive_int(const Source& src, const char* key) {
  int value = json_fields::required_int(src, key);
  if (value <= 0) fail(src, key, "must be positive, got " + std::to_string(value));
  return value;
}

std::string architecture_of(const Source& src) {
  auto it = src.object.find("architectures");
  if (it == src.object.end() || !it->is_array() || it->empty() || !(*it)[0].is_string()) {
    fail(src, "architectures", "must be a non-empty list of names");
  }
  for (const nlohmann::json& name : *it) {
    if (!name.is_string() || name.get<std::string>() != kSupportedArchitecture) {
      fail(src, "architectures",
           "names unsupported architecture " + name.dump() + " (only Qwen3ForCausalLM)");
    }
  }
  return kSupportedArchitecture;
}

void refuse_unimplemented(const Source& src) {
  std::optional<std::string> act = json_fields::optional_string(src, "hidden_act");
  if (act && *act != "silu") fail(src, "hidden_act", "is '" + *act + "'; only silu is implemented");
  if (json_fields::optional_bool(src, "attention_bias").value_or(false)) {
    fail(src, "attention_bias", "is true; attention biases are not implemented");
  }
  auto scaling = src.object.find("rope_scaling");
  if (scaling != src.object.end() && !scaling->is_null()) {
    fail(src, "rope_scaling", "is " + scaling->dump() + "; RoPE scaling is not implemented");
  }
  if (json_fields::optional_bool(src, "use_sliding_window").value_or(false)) {
    fail(src, "use_sliding_window", "is true; sliding-window attention is not implemented");
  }
  // transformers >= 5 names each layer's attention kind.
  auto layer_types = src.object.find("layer_types");
  if (layer_types != src.object.end() && !layer_types->is_null()) {
    if (!layer_types->is_array()) fail(src, "layer_types", "must be a list");
    for (const auto& type : *layer_types) {
      if (type != "full_attention") {
        fail(src, "layer_types", "holds " + type.dump() + "; only full_attention is implemented");
      }
    }
  }
}

// rope_theta: a top-level number (transformers < 5) or rope_parameters.rope_theta with
// rope_type "default" (transformers >= 5 writes rope_parameters instead).
double rope_theta_of(const Source& src) {
  auto parameters = src.object.find("rope_parameters");
  if (parameters == src.object.end() || parameters->is_null()) {
    return json_fields::required_number(src, "rope_theta");
  }
  if (!parameters->is_object()) fail(src, "rope_parameters", "must be an object");
  auto type = parameters->find("rope_type");
  if (type != parameters->end() && *type != "default") {
    fail(src, "rope_parameters", "has rope_type " + type->dump() + "; RoPE scaling is not implemented");
  }
  auto theta = parameters->find("rope_theta");
  if (theta == parameters->end() || !theta->is_number()) {
    fail(src, "rope_parameters", "needs a number rope_theta");
  }
  return theta->get<double>();
}

DType dtype_of(const Source& src) {
  // Newer transformers write "dtype"; older ones "torch_dtype". Absent means float32.
  const char* key = src.object.contains("torch_dtype") ? "torch_dtype" : "dtype";
  std::optional<std::string> name = json_fields::optional_string(src, key);
  if (!name) return DType::kF32;
  Result<DType> dtype = parse_dtype(*name);
  if (!dtype.ok()) fail(src, key, "names " + dtype.status().message());
  return *dtype;
}

ModelConfig parse_or_throw(const Source& src) {
  if (!src.object.is_object()) {
    PDS_THROW(StatusCode::kInvalidArgument, src.name + ": expected a JSON object");
  }
  ModelConfig config;
  config.architecture = architecture_of(src);
  refuse_unimplemented(src);
  config.vocab_size = positive_int(src, "vocab_size");
  config.hidden_size = positive_int(src, "hidden_size");
  config.intermediate_size = positive_int(src, "intermediate_size");
  config.num_hidden_layers = positive_int(src, "num_hidden_layers");
  config.num_attention_heads = positive_int(src, "num_attention_heads");
  config.num_key_value_heads = positive_int(src, "num_key_value_heads");
  if (config.num_attention_heads % config.num_key_value_heads != 0) {
    fail(src, "num_key_value_heads",
         "(" + std::to_string(config.num_key_value_heads) + ") must divide num_attention_heads (" +
             std::to_string(config.num_attention_heads) + ")");
  }
  if (json_fields::optional_int(src, "head_dim")) {
    config.head_dim = positive_int(src, "head_dim");
  } else {
    if (config.hidden_size % config.num_attention_heads != 0) {
      fail(src, "head_dim", "is absent and hidden_size is not divisible by num_attention_heads");
    }
    config.head_dim = config.hidden_size / config.num_attention_heads;
  }
  double eps = json_fields::required_number(src, "rms_norm_eps");
  if (!(eps > 0.0 && eps < 1.0)) fail(src, "rms_norm_eps", "must be in (0, 1)");
  config.rms_norm_eps = static_cast<float>(eps);
  config.rope_theta = rope_theta_of(src);
  if (!(config.rope_theta > 0.0)) fail(src, "rope_theta", "must be positive");
  config.max_position_embeddings = positive_int(src, "max_position_embeddings");
  config.tie_word_embeddings =
      json_fields::optional_bool(src, "tie_word_embeddings").value_or(false);
  config.torch_dtype = dtype_of(src);
  config.quantization = parse_quantization_config(src.object, src.name);
  config.bos_token_id = json_fields::optional_int(src, "bos_token_id");
  config.eos_token_ids = json_fields::int_or_int_list(src, "eos_token_id");
  auto check_token = [&](int id, const char* key) {
    if (id < 0 || id >= config.vocab_size) {
      fail(src, key, "token id " + std::to_string(id) + " is outside the vocabulary");
    }
  };
  if (config.bos_token_id) check_token(*config.bos_token_id, "bos_token_id");
  for (int id : config.eos_token_ids) check_token(id, "eos_token_id");
  return config;
}

}  // namespace

Result<ModelConfig> parse_model_config(const nlohmann::json& json, const std::string& source) {
  return capture_status([&]() -> Result<ModelConfig> { return parse_or_throw({json, source}); });
}

Result<ModelConfig> load_model_config(const std::filesystem::path& path) {
  PDS_ASSIGN_OR_RETURN(nlohmann::json json, read_json_file(path));
  return parse_model_config(json, path.string());
}

}  // namespace pdserve
