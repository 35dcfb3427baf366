#include "common/model/quantization_config.h"

#include <string>

#include "common/core/status.h"
#include "common/model/json_fields.h"

namespace pdserve {
namespace {

constexpr const char* kKey = "quantization_config";

[[noreturn]] void refuse(const json_fields::Source& src, const std::string& field,
                         const std::string& problem) {
  PDS_THROW(StatusCode::kUnimplemented, src.name + ": key '" + kKey + "." + field + "' " + problem);
}

[[noreturn]] void malformed(const json_fields::Source& src, const std::string& field,
                            const std::string& problem) {
  PDS_THROW(StatusCode::kInvalidArgument,
            src.name + ": key '" + kKey + "." + field + "' " + problem);
}

std::optional<std::string> string_field(const json_fields::Source& src,
                                        const nlohmann::json& object, const char* field) {
  auto it = object.find(field);
  if (it == object.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) malformed(src, field, "must be a string, got " + it->dump());
  return it->get<std::string>();
}

void read_block_size(const json_fields::Source& src, const nlohmann::json& object,
                     Fp8WeightQuantization& quantization) {
  auto it = object.find("weight_block_size");
  if (it == object.end() || it->is_null()) return;
  if (!it->is_array() || it->size() != 2 || !(*it)[0].is_number_integer() ||
      !(*it)[1].is_number_integer() || (*it)[0].get<int64_t>() <= 0 ||
      (*it)[1].get<int64_t>() <= 0) {
    malformed(src, "weight_block_size", "must be two positive integers, got " + it->dump());
  }
  const int64_t block_n = (*it)[0].get<int64_t>();
  const int64_t block_k = (*it)[1].get<int64_t>();
  if (block_n != kFp8WeightBlock || block_k != kFp8WeightBlock) {
    refuse(src, "weight_block_size",
           "is " + it->dump() +
               "; only [128, 128] blocks (or per-tensor / per-channel scales) "
               "are implemented");
  }
  quantization.block_n = block_n;
  quantization.block_k = block_k;
}

}  // namespace

std::optional<Fp8WeightQuantization> parse_quantization_config(const nlohmann::json& config,
                                                               const std::string& source) {
  const json_fields::Source src{config, source};
  auto it = src.object.find(kKey);
  if (it == src.object.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) json_fields::fail(src, kKey, "must be an object, got " + it->dump());
  const nlohmann::json& object = *it;
  const std::optional<std::string> method = string_field(src, object, "quant_method");
  if (!method) malformed(src, "quant_method", "is missing");
  if (*method != "fp8") {
    refuse(src, "quant_method", "is '" + *method + "'; only fp8 checkpoints are implemented");
  }
  const std::optional<std::string> format = string_field(src, object, "fmt");
  if (format && *format != "e4m3") {
    refuse(src, "fmt", "is '" + *format + "'; only e4m3 FP8 weights are implemented");
  }
  const std::string activations =
      string_field(src, object, "activation_scheme").value_or("dynamic");
  if (activations == "static") {
    refuse(src, "activation_scheme",
           "is 'static'; only dynamic activation scaling is implemented (activations stay in "
           "the compute dtype)");
  }
  if (activations != "dynamic") {
    malformed(src, "activation_scheme", "is '" + activations + "'; expected dynamic or static");
  }
  Fp8WeightQuantization quantization;
  read_block_size(src, object, quantization);
  return quantization;
}

}  // namespace pdserve
