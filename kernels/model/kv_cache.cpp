#include "kernels/model/kv_cache.h"

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
  Result<DType> dtype = parse_dtype(name);
  if (!dtype.ok() || *dtype == DType::kF16) {
    return invalid_argument("--kv-cache-dtype must be auto, bfloat16 or float32, got '" +
                            std::string(name) + "'");
  }
  return std::optional<DType>(*dtype);
}

Result<KvCache> KvCache::create(Backend& backend, const KvLayout& layout) {
  if (layout.num_blocks <= 0 || layout.block_size <= 0 || layout.num_layers <= 0 ||
      layout.num_kv_heads <= 0 || layout.head_dim <= 0) {
    return invalid_argument("KV cache: every dimension must be positive (blocks " +
                            std::to_string(layout.num_blocks) + ", block size " +
                            std::to_string(layout.block_size) + ")");
  }
  if (layout.dtype == DType::kF16) return unimplemented("KV cache: float16 is not supported");
  Result<DeviceBuffer> buffer = backend.allocate(layout.total_bytes());
  if (!buffer.ok())
    return buffer.status().with_context("KV cache of " + std::to_string(layout.total_bytes()) +
                                        " bytes");
  return KvCache(layout, backend, std::move(buffer).value());
}

KvCacheView KvCache::view() const {
  KvCacheView view;
  view.k = buffer_.data();
  view.v = static_cast<std::byte*>(buffer_.data()) + layout_.offset(0, 0, true);
  view.layout = layout_;
  return view;
}

}  // namespace pdserve
