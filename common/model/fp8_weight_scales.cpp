#include "common/model/fp8_weight_scales.h"

#include <cmath>
#include <memory>
#include <vector>

#include "common/model/tensor_shape.h"

namespace pdserve {
namespace {

constexpr std::string_view kSuffixes[] = {"_scale_inv", "_scale"};

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

struct ScaleBlocks {
  int64_t n = 0;
  int64_t k = 0;
};

Result<ScaleBlocks> blocks_for(const Checkpoint& checkpoint, const TensorView& scale, int64_t n,
                               int64_t k) {
  const Fp8WeightQuantization& quantization = *checkpoint.config().quantization;
  const auto wrong_shape = [&](const std::string& expected) {
    return invalid_argument("scale tensor '" + scale.name + "' in '" + checkpoint.dir().string() +
                            "' has shape " + shape_string(scale.shape) + ", expected " + expected);
  };
  if (quantization.block_scaled()) {
    const int64_t block_n = *quantization.block_n;
    const int64_t block_k = *quantization.block_k;
    const std::vector<int64_t> expected = {ceil_div(n, block_n), ceil_div(k, block_k)};
    if (scale.shape != expected) {
      return wrong_shape(shape_string(expected) + " (one per " + std::to_string(block_n) + "x" +
                         std::to_string(block_k) +
                         " block of quantization_config's "
                         "weight_block_size)");
    }
    return ScaleBlocks{block_n, block_k};
  }
  if (scale.numel() == 1 && scale.shape.size() <= 2) return ScaleBlocks{n, k};
  if (scale.shape == std::vector<int64_t>{n, 1} || scale.shape == std::vector<int64_t>{n}) {
    return ScaleBlocks{1, k};
  }
  return wrong_shape("a scalar (per tensor) or " + shape_string(std::vector<int64_t>{n, 1}) +
                     " (per output channel): config.json's quantization_config has no "
                     "weight_block_size");
}

// The scale tensor of weight `name`: NOT_FOUND when there is none, INVALID_ARGUMENT for two.
Result<TensorView> scale_tensor_of(const Checkpoint& checkpoint, const std::string& name) {
  std::vector<std::string> present;
  for (std::string_view suffix : kSuffixes) {
    std::string candidate = name + std::string(suffix);
    if (checkpoint.has_tensor(candidate)) present.push_back(std::move(candidate));
  }
  if (present.empty()) {
    return not_found("FP8 weight '" + name + "' in '" + checkpoint.dir().string() +
                     "' has no scale tensor ('" + name + "_scale_inv' or '" + name + "_scale')");
  }
  if (present.size() > 1) {
    return invalid_argument("FP8 weight '" + name + "' has two scale tensors ('" + present[0] +
                            "' and '" + present[1] + "')");
  }
  return checkpoint.tensor(present.front());
}

}  // namespace

bool is_fp8_scale_name(std::string_view name) {
  for (std::string_view suffix : kSuffixes) {
    if (name.ends_with(std::string("weight") + std::string(suffix))) return true;
  }
  return false;
}

std::string fp8_scale_owner(std::string_view scale_name) {
  for (std::string_view suffix : kSuffixes) {
    if (scale_name.ends_with(suffix)) {
      return std::string(scale_name.substr(0, scale_name.size() - suffix.size()));
    }
  }
  return std::string(scale_name);
}

Status attach_fp8_scales(const Checkpoint& checkpoint, const TensorSpec& spec, HostTensor& tensor) {
  const std::string& name = spec.name;
  // Qwen's FP8 exports quantize only these; embeddings, norms and lm_head keep the model dtype.
  if (!spec.is_linear) {
    return unimplemented("tensor '" + name +
                         "' is FP8 (F8_E4M3): only the linear layers' weights (q/k/v/o/gate/up/"
                         "down_proj) may be FP8; embeddings, norms and lm_head must be stored "
                         "in a floating-point dtype");
  }
  if (!checkpoint.config().quantization) {
    return invalid_argument("tensor '" + name + "' is FP8 (F8_E4M3) but '" +
                            checkpoint.dir().string() +
                            "/config.json' has no quantization_config to say how it is scaled");
  }
  PDS_ASSIGN_OR_RETURN(TensorView scale, scale_tensor_of(checkpoint, name));
  if (scale.dtype == DType::kF8E4M3) {
    return invalid_argument("scale tensor '" + scale.name + "' is FP8; expected F32, BF16 or F16");
  }
  const int64_t n = tensor.shape.at(0);
  const int64_t k = tensor.shape.at(1);
  PDS_ASSIGN_OR_RETURN(ScaleBlocks blocks, blocks_for(checkpoint, scale, n, k));
  const size_t count = static_cast<size_t>(scale.numel());
  std::shared_ptr<float[]> values(new float[count]);
  convert_elements(scale.data, scale.dtype, values.get(), DType::kF32, count);
  for (size_t i = 0; i < count; ++i) {
    if (!std::isfinite(values[i])) {
      return invalid_argument("scale tensor '" + scale.name + "' holds " +
                              std::to_string(values[i]) + " at index " + std::to_string(i) +
                              "; scales must be finite");
    }
  }
  tensor.scale = values.get();
  tensor.scale_block_n = blocks.n;
  tensor.scale_block_k = blocks.k;
  tensor.scale_keep_alive = std::move(values);
  return {};
}

Status refuse_scale_of_unquantized(const Checkpoint& checkpoint, const std::string& name) {
  for (std::string_view suffix : kSuffixes) {
    const std::string candidate = name + std::string(suffix);
    if (checkpoint.has_tensor(candidate)) {
      return invalid_argument("tensor '" + name +
                              "' is not FP8 but the checkpoint has a scale "
                              "tensor '" +
                              candidate + "' for it");
    }
  }
  return {};
}

}  // namespace pdserve
