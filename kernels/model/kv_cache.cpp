#include "kernels/model/kv_cache.h"

#include <string>

namespace pdserve {

size_t KvCacheShape::bytes_per_token() const {
  return 2 * static_cast<size_t>(num_layers) * static_cast<size_t>(num_kv_heads) *
         static_cast<size_t>(head_dim) * dtype_size(dtype);
}

KvCacheShape kv_cache_shape_for(const ModelConfig& config, int num_blocks, int block_size,
                                DType dtype) {
  KvCacheShape shape;
  shape.num_layers = config.num_hidden_layers;
  shape.num_blocks = num_blocks;
  shape.block_size = block_size;
  shape.num_kv_heads = config.num_key_value_heads;
  shape.head_dim = config.head_dim;
  shape.dtype = dtype;
  return shape;
}

int kv_blocks_for_memory(const ModelConfig& config, size_t memory_bytes, int block_size,
                         DType dtype) {
  const size_t per_block = kv_cache_shape_for(config, 1, block_size, dtype).bytes_per_block();
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

Result<KvCache> KvCache::create(Backend& backend, const KvCacheShape& shape) {
  if (shape.num_blocks <= 0 || shape.block_size <= 0 || shape.num_layers <= 0 ||
      shape.num_kv_heads <= 0 || shape.head_dim <= 0) {
    return invalid_argument("KV cache: every dimension must be positive (blocks " +
                            std::to_string(shape.num_blocks) + ", block size " +
                            std::to_string(shape.block_size) + ")");
  }
  if (shape.dtype == DType::kF16) return unimplemented("KV cache: float16 is not supported");
  Result<DeviceBuffer> buffer = backend.allocate(shape.total_bytes());
  if (!buffer.ok())
    return buffer.status().with_context("KV cache of " + std::to_string(shape.total_bytes()) +
                                        " bytes");
  return KvCache(shape, backend.kind(), std::move(buffer).value());
}

KvCacheView KvCache::view() const {
  KvCacheView view;
  const size_t half = shape_.total_bytes() / 2;
  view.k = buffer_.data();
  view.v = static_cast<std::byte*>(buffer_.data()) + half;
  view.dtype = shape_.dtype;
  view.num_layers = shape_.num_layers;
  view.num_blocks = shape_.num_blocks;
  view.block_size = shape_.block_size;
  view.num_kv_heads = shape_.num_kv_heads;
  view.head_dim = shape_.head_dim;
  return view;
}

}  // namespace pdserve
