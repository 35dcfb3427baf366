// Sampling defaults from a Hugging Face generation_config.json. Every field is optional; a
// missing file yields all defaults, a malformed one is an error naming the file and key.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/core/status.h"

namespace pdserve {

struct GenerationConfig {
  std::optional<float> temperature;  // >= 0
  std::optional<float> top_p;        // in (0, 1]
  std::optional<int> top_k;          // >= 0 (0 disables)
  std::optional<bool> do_sample;
  std::optional<int> bos_token_id;
  std::optional<int> pad_token_id;
  std::vector<int> eos_token_ids;  // eos_token_id may be an int or a list
};

Result<GenerationConfig> load_generation_config(const std::filesystem::path& path);
Result<GenerationConfig> parse_generation_config(const nlohmann::json& json,
                                                 const std::string& source);

}  // namespace pdserve
