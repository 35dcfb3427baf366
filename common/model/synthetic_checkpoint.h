// Writes a complete Hugging Face model folder with deterministic random Qwen3 weights, for
// tests and benchmarks: config.json (with overrides), generation_config.json, the tokenizer
// files, and safetensors (one file or shards plus model.safetensors.index.json).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "common/core/dtype.h"
#include "common/core/status.h"
#include "common/model/model_config.h"

namespace pdserve {

// Like transformers' default max_shard_size of "5GB" (decimal).
inline constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000ull;
inline constexpr double kSyntheticWeightStddev = 0.02;

struct SyntheticCheckpointOptions {
  std::filesystem::path config_path;  // a Qwen3 config.json
  std::filesystem::path out_dir;      // created if absent; stale weight files are removed
  uint64_t seed = 0;
  std::optional<int> num_layers;            // overrides num_hidden_layers
  std::optional<DType> dtype;               // overrides torch_dtype (the weights' dtype)
  std::optional<bool> tie_word_embeddings;  // overrides tie_word_embeddings
  // An FP8 checkpoint in Qwen's "-FP8" layout: the decoder layers' projections quantized from
  // the weights a bf16 checkpoint of the same seed holds (common/model/fp8_quantizer.h), as
  // F8_E4M3 with bf16 `<name>_scale_inv` per 128x128 block, and a quantization_config in
  // config.json; embeddings, norms and lm_head in the weight dtype.
  bool fp8 = false;
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
  std::filesystem::path tokenizer_dir;  // holds tokenizer.json and tokenizer_config.json
  unsigned threads = 0;                 // 0: all hardware threads; output is the same for any
};

struct SyntheticCheckpoint {
  ModelConfig config;  // as written, overrides applied
  std::vector<std::filesystem::path> weight_files;
  uint64_t weight_bytes = 0;  // tensor data, headers excluded
};

// Projections and embeddings ~ N(0, 0.02^2); norm weights ~ 1 + N(0, 0.02^2). Element i of
// tensor `name` is a pure function of (seed, name, i): the bytes are identical on any machine
// and for any thread count (an FP8 weight's codes and scales: of its 128-row stripe). Tied
// models get no lm_head.weight; untied ones do.
Result<SyntheticCheckpoint> write_synthetic_checkpoint(const SyntheticCheckpointOptions& options);

}  // namespace pdserve
