#include "kernels/model/kv_scales.h"

#include <cmath>
#include <string>

#include "common/core/dtype.h"

namespace pdserve {
namespace {

std::string scale_name(int layer, char half) {
  return "model.layers." + std::to_string(layer) + ".self_attn." + half + "_scale";
}

Result<float> read_scale(const Checkpoint& checkpoint, const std::string& name) {
  PDS_ASSIGN_OR_RETURN(const TensorView tensor, checkpoint.tensor(name));
  if (tensor.numel() != 1) {
    return invalid_argument("KV cache scale " + name + " has " + std::to_string(tensor.numel()) +
                            " values, not one (per-head scales are not supported)");
  }
  const float value = load_as_float(tensor.data, tensor.dtype, 0);
  if (!(value > 0.0f) || !std::isfinite(value)) {
    return invalid_argument("KV cache scale " + name + " is not a positive number");
  }
  return value;
}

}  // namespace

Result<KvScales> read_kv_scales(const Checkpoint& checkpoint, int num_layers) {
  KvScales scales;
  int present = 0;
  for (int layer = 0; layer < num_layers; ++layer) {
    present += checkpoint.has_tensor(scale_name(layer, 'k'));
    present += checkpoint.has_tensor(scale_name(layer, 'v'));
  }
  if (present == 0) return scales;
  if (present != 2 * num_layers) {
    return invalid_argument("the checkpoint has k_scale / v_scale for some layers only (" +
                            std::to_string(present) + " of " + std::to_string(2 * num_layers) +
                            " tensors)");
  }
  for (int layer = 0; layer < num_layers; ++layer) {
    PDS_ASSIGN_OR_RETURN(const float k, read_scale(checkpoint, scale_name(layer, 'k')));
    PDS_ASSIGN_OR_RETURN(const float v, read_scale(checkpoint, scale_name(layer, 'v')));
    scales.k.push_back(k);
    scales.v.push_back(v);
  }
  return scales;
}

Result<KvScales> kv_scales_for_model(const std::filesystem::path& model_dir, DType kv_dtype,
                                     int num_layers) {
  if (kv_dtype != DType::kF8E4M3) return KvScales{};
  PDS_ASSIGN_OR_RETURN(const Checkpoint checkpoint, Checkpoint::open(model_dir));
  return read_kv_scales(checkpoint, num_layers);
}

}  // namespace pdserve
