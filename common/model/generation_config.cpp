#include "common/model/generation_config.h"

#include "common/core/files.h"
#include "common/model/json_fields.h"

namespace pdserve {
namespace {

using json_fields::fail;
using json_fields::Source;

std::optional<int> non_negative_int(const Source& src, const char* key) {
  std::optional<int> value = json_fields::optional_int(src, key);
  if (value && *value < 0) fail(src, key, "must not be negative");
  return value;
}

GenerationConfig parse_or_throw(const Source& src) {
  if (!src.object.is_object()) {
    PDS_THROW(StatusCode::kInvalidArgument, src.name + ": expected a JSON object");
  }
  GenerationConfig config;
  if (std::optional<double> t = json_fields::optional_number(src, "temperature")) {
    if (!(*t >= 0.0)) fail(src, "temperature", "must not be negative");
    config.temperature = static_cast<float>(*t);
  }
  if (std::optional<double> p = json_fields::optional_number(src, "top_p")) {
    if (!(*p > 0.0 && *p <= 1.0)) fail(src, "top_p", "must be in (0, 1]");
    config.top_p = static_cast<float>(*p);
  }
  config.top_k = non_negative_int(src, "top_k");
  config.do_sample = json_fields::optional_bool(src, "do_sample");
  config.bos_token_id = non_negative_int(src, "bos_token_id");
  config.pad_token_id = non_negative_int(src, "pad_token_id");
  config.eos_token_ids = json_fields::int_or_int_list(src, "eos_token_id");
  for (int id : config.eos_token_ids) {
    if (id < 0) fail(src, "eos_token_id", "must not be negative");
  }
  return config;
}

}  // namespace

Result<GenerationConfig> parse_generation_config(const nlohmann::json& json,
                                                 const std::string& source) {
  return capture_status([&]() -> Result<GenerationConfig> {
    return parse_or_throw({json, source});
  });
}

Result<GenerationConfig> load_generation_config(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return GenerationConfig{};
  PDS_ASSIGN_OR_RETURN(nlohmann::json json, read_json_file(path));
  return parse_generation_config(json, path.string());
}

}  // namespace pdserve
