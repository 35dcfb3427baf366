// The parts of a model's generation_config.json that serving needs: the EOS token ids that end
// a generation and the sampling defaults used when a request leaves a value unset.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/core/status.h"
#include "common/sampling/sampling_params.h"

namespace pdserve {

struct GenerationConfig {
  std::vector<int32_t> eos_token_ids;  // "eos_token_id": one id or a list, in file order
  SamplingDefaults sampling;           // temperature, top_p, top_k, min_p, repetition_penalty
};

// Keys absent or null stay unset. "do_sample" is ignored, as vLLM does. InvalidArgument names
// `source` and the key when a value has the wrong type or range (an EOS id must lie in
// [0, 2^31), a sampling default must pass SamplingParams::validate's range).
Result<GenerationConfig> parse_generation_config(const nlohmann::json& json,
                                                 std::string_view source);
Result<GenerationConfig> load_generation_config(const std::filesystem::path& path);

}  // namespace pdserve
