#include "kernels/model/kv_cache.h"

#include <cmath>
#include <string>

namespace pdserve {

KvLayout kv_layout_for(const ModelConfig& config, int num_blocks, int block_size, DType dtype) {
  KvLayout layout;
  layout.num_layers = config.num_hidden_layers;
  layout.num_blocks = num_blocks;
  layout.block_size = block_size;
  layout.num_kv_heads = config.num_key_value_heads;
  layout.head_dim = config.head_dim;
  layout.dtype = dtype;
  return layout;
}

int kv_blocks_for_memory(const ModelConfig& config, size_t memory_bytes, int block_size,
                         DType dtype) {
  const size_t per_block = kv_layout_for(config, 1, block_size, dtype).bytes_per_block();
  return per_block == 0 ? 0 : static_cast<int>(memory_bytes / per_block);
}

Result<std::optional<DType>> parse_kv_cache_dtype(std::string_view name) {
  if (name == "auto") return std::optional<DType>();
  if (name == "fp8" || name == "fp8_e4m3") return std::optional<DType>(DType::kF8E4M3);
  if (name == "fp8_e5m2") {
    return invalid_argument(
        "--kv-cache-dtype fp8_e5m2 is not supported: use fp8 (fp8_e4m3), bfloat16 or float32");
  }
  Result<DType> dtype = parse_dtype(name);
  if (!dtype.ok() || *dtype == DType::kF16) {
    return invalid_argument(
        "--kv-cache-dtype must be auto, bfloat16, float32, fp8 or fp8_e4m3, got '" +
        std::string(name) + "'");
  }
  return std::optional<DType>(*dtype);
}

namespace {

Status check_scales(const KvLayout& layout, const KvScales& scales) {
  if (scales.k.empty() && scales.v.empty()) return {};
  if (layout.dtype != DType::kF8E4M3) {
    return invalid_argument("KV cache: k_scale / v_scale apply to an fp8 cache only");
  }
  const auto count = static_cast<size_t>(layout.num_layers);
  if (scales.k.size() != count || scales.v.size() != count) {
    return invalid_argument("KV cache: expected " + std::to_string(count) +
                            " k_scale and v_scale values (one per layer)");
  }
  for (size_t layer = 0; layer < count; ++layer) {
    for (const float scale : {scales.k[layer], scales.v[layer]}) {
      if (!(scale > 0.0f) || !std::isfinite(scale)) {
        return invalid_argument("KV cache: layer " + std::to_string(layer) +
                                " has a k_scale or v_scale that is not a positive number");
      }
    }
  }
  return {};
}

}  // namespace

Result<KvCache> KvCache::create(Backend& backend, const KvLayout& layout, KvScales scales) {
  if (layout.num_blocks <= 0 || layout.block_size <= 0 || layout.num_layers <= 0 ||
      layout.num_kv_heads <= 0 || layout.head_dim <= 0) {
    return invalid_argument("KV cache: every dimension must be positive (blocks " +
                            std::to_string(layout.num_blocks) + ", block size " +
                            std::to_string(layout.block_size) + ")");
  }
  if (layout.dtype == DType::kF16) return unimplemented("KV cache: float16 is not supported");
  PDS_RETURN_IF_ERROR(check_scales(layout, scales));
  Result<DeviceBuffer> buffer = backend.allocate(layout.total_bytes());
  if (!buffer.ok())
    return buffer.status().with_context("KV cache of " + std::to_string(layout.total_bytes()) +
                                        " bytes");
  return KvCache(layout, std::move(scales), backend, std::move(buffer).value());
}

KvCacheView KvCache::view() const {
  KvCacheView view;
  view.k = buffer_.data();
  view.v = static_cast<std::byte*>(buffer_.data()) + layout_.offset(0, 0, true);
  view.layout = layout_;
  if (!scales_.k.empty()) {
    view.k_scales = scales_.k.data();
    view.v_scales = scales_.v.data();
  }
  return view;
}

}  // namespace pdserve
