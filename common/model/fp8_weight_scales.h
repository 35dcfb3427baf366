// The scale tensors of an FP8 checkpoint's linear weights: which tensor holds a weight's
// scales, its shape check against the quantization_config, and its conversion to the float32
// multipliers HostTensor carries (common/model/qwen3_weights.h).
#pragma once

#include <string>
#include <string_view>

#include "common/core/status.h"
#include "common/model/checkpoint.h"
#include "common/model/qwen3_layout.h"
#include "common/model/qwen3_weights.h"

namespace pdserve {

// Whether `name` is a checkpoint's scale tensor (`<weight>_scale_inv` as Qwen and DeepSeek
// name block scales, `<weight>_scale` as per-tensor / per-channel exports do); both hold
// multipliers: value = fp8 code x scale.
bool is_fp8_scale_name(std::string_view name);
// The weight a scale tensor belongs to ("...q_proj.weight" for "...q_proj.weight_scale_inv").
std::string fp8_scale_owner(std::string_view scale_name);

// Sets `tensor`'s scale fields (tensor: the FP8 weight `spec`, shape {n, k}) from its scale
// tensor in `checkpoint`. Refuses, naming the tensor: FP8 outside the linear layers
// (UNIMPLEMENTED), a checkpoint without quantization_config, a missing or doubled scale
// tensor, a scale of the wrong shape or dtype or with a value that is not finite.
Status attach_fp8_scales(const Checkpoint& checkpoint, const TensorSpec& spec, HostTensor& tensor);

// INVALID_ARGUMENT when a weight stored in a floating-point dtype has a scale tensor (its
// meaning would be ambiguous).
Status refuse_scale_of_unquantized(const Checkpoint& checkpoint, const std::string& name);

}  // namespace pdserve
