// The quantization_config of a Hugging Face config.json: the quantized checkpoint formats
// pdserve loads. Today that is FP8 E4M3 weights with dynamic activation scaling, as Qwen's
// "-FP8" exports write (quant_method "fp8", fmt "e4m3", activation_scheme "dynamic",
// weight_block_size [128, 128]) and per-tensor / per-channel FP8 exports (no
// weight_block_size; the scale tensors' shapes say which).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace pdserve {

// The only block shape the kernels (and Qwen's exports) use.
inline constexpr int64_t kFp8WeightBlock = 128;

struct Fp8WeightQuantization {
  // Rows x columns of weights one scale covers; absent: one scale per tensor or per output
  // channel, as each scale tensor's shape says.
  std::optional<int64_t> block_n;
  std::optional<int64_t> block_k;
  bool block_scaled() const { return block_n.has_value(); }
};

// Reads the `quantization_config` of the config.json object `config` (absent or null:
// std::nullopt); `source` names the file in errors. Throws pdserve::Error naming the field:
// INVALID_ARGUMENT for malformed values, UNIMPLEMENTED for formats pdserve does not run (other
// quant_method, fmt other than e4m3, activation_scheme static, block sizes other than 128 x 128).
std::optional<Fp8WeightQuantization> parse_quantization_config(const nlohmann::json& config,
                                                               const std::string& source);

}  // namespace pdserve
