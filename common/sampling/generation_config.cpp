#include "common/sampling/generation_config.h"

#include <limits>
#include <string>

#include "common/core/files.h"

namespace pdserve {
namespace {

Status bad_key(std::string_view source, std::string_view key, std::string_view problem) {
  return invalid_argument(std::string(source) + ": \"" + std::string(key) + "\" " +
                          std::string(problem));
}

Result<int32_t> parse_token_id(const nlohmann::json& value, std::string_view source,
                               std::string_view key) {
  if (!value.is_number_integer()) return bad_key(source, key, "must be an integer token id");
  int64_t id = value.get<int64_t>();
  if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
    return bad_key(source, key, "= " + std::to_string(id) + " is not a valid token id");
  }
  return static_cast<int32_t>(id);
}

Status parse_float(const nlohmann::json& json, std::string_view source, const char* key,
                   std::optional<float>& out) {
  auto it = json.find(key);
  if (it == json.end() || it->is_null()) return {};
  if (!it->is_number()) return bad_key(source, key, "must be a number");
  out = it->get<float>();
  return {};
}

}  // namespace

Result<GenerationConfig> parse_generation_config(const nlohmann::json& json,
                                                 std::string_view source) {
  if (!json.is_object()) return invalid_argument(std::string(source) + ": not a JSON object");
  GenerationConfig config;

  if (auto it = json.find("eos_token_id"); it != json.end() && !it->is_null()) {
    if (it->is_array()) {
      for (size_t i = 0; i < it->size(); ++i) {
        std::string key = "eos_token_id[" + std::to_string(i) + "]";
        PDS_ASSIGN_OR_RETURN(int32_t id, parse_token_id((*it)[i], source, key));
        config.eos_token_ids.push_back(id);
      }
    } else {
      PDS_ASSIGN_OR_RETURN(int32_t id, parse_token_id(*it, source, "eos_token_id"));
      config.eos_token_ids.push_back(id);
    }
  }

  SamplingDefaults& sampling = config.sampling;
  PDS_RETURN_IF_ERROR(parse_float(json, source, "temperature", sampling.temperature));
  PDS_RETURN_IF_ERROR(parse_float(json, source, "top_p", sampling.top_p));
  PDS_RETURN_IF_ERROR(parse_float(json, source, "min_p", sampling.min_p));
  PDS_RETURN_IF_ERROR(parse_float(json, source, "repetition_penalty", sampling.repetition_penalty));
  if (auto it = json.find("top_k"); it != json.end() && !it->is_null()) {
    if (!it->is_number_integer()) return bad_key(source, "top_k", "must be an integer");
    int64_t top_k = it->get<int64_t>();
    if (top_k < -1 || top_k > std::numeric_limits<int>::max()) {
      return bad_key(source, "top_k", "= " + std::to_string(top_k) + " is out of range");
    }
    sampling.top_k = static_cast<int>(top_k);
  }

  // Range-check the defaults the same way a request is checked. The vocabulary is unknown
  // here, and no stop ids are involved, so any positive size will do.
  SamplingParams defaults_only = resolve_sampling_defaults({}, {}, sampling);
  Status valid = defaults_only.validate(1);
  if (!valid.ok()) return valid.with_context(source);
  return config;
}

Result<GenerationConfig> load_generation_config(const std::filesystem::path& path) {
  PDS_ASSIGN_OR_RETURN(nlohmann::json json, read_json_file(path));
  return parse_generation_config(json, path.string());
}

}  // namespace pdserve
