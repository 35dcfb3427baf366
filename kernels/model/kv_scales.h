// The per-layer scales of an FP8 KV cache (--kv-cache-dtype fp8), as vLLM's k_scale / v_scale:
// the pool stores x / scale and reads code * scale. 1.0 unless the checkpoint has them.
#pragma once

#include <filesystem>
#include <vector>

#include "common/core/status.h"
#include "common/model/checkpoint.h"

namespace pdserve {

// Empty for 1.0 everywhere (the default; Qwen's FP8 checkpoints ship none), else num_layers
// values each.
struct KvScales {
  std::vector<float> k = {};
  std::vector<float> v = {};

  bool operator==(const KvScales&) const = default;
};

// The checkpoint's `model.layers.{i}.self_attn.k_scale` and `.v_scale` (vLLM's names for an
// attention layer's KV cache scales; one value each, any float dtype): every layer's, or none
// (empty scales). InvalidArgument for some layers only, a tensor of more than one value, or a
// value that is not a positive finite number.
Result<KvScales> read_kv_scales(const Checkpoint& checkpoint, int num_layers);

// The scales a pool of `kv_dtype` for the model in `model_dir` uses: for FP8, read_kv_scales of
// its checkpoint; empty for any other dtype.
Result<KvScales> kv_scales_for_model(const std::filesystem::path& model_dir, DType kv_dtype,
                                     int num_layers);

}  // namespace pdserve
