// The paged KV pool of one node: a single backend allocation holding K then V for every
// layer, laid out [layers][blocks][block_size][kv_heads][head_dim]. One allocation so that the
// KV transfer layer can register it once.
#pragma once

#include <optional>
#include <string_view>

#include "common/model/model_config.h"
#include "kernels/backend.h"

namespace pdserve {

struct KvCacheShape {
  int num_layers = 0;
  int num_blocks = 0;
  int block_size = 16;
  int num_kv_heads = 0;
  int head_dim = 0;
  DType dtype = DType::kF32;

  // K and V of one token across all layers.
  size_t bytes_per_token() const;
  size_t bytes_per_block() const { return bytes_per_token() * static_cast<size_t>(block_size); }
  size_t total_bytes() const { return bytes_per_block() * static_cast<size_t>(num_blocks); }
};

// The shape of a pool of `num_blocks` blocks for `config`.
KvCacheShape kv_cache_shape_for(const ModelConfig& config, int num_blocks, int block_size,
                                DType dtype);
// How many blocks fit in `memory_bytes` (at least 0).
int kv_blocks_for_memory(const ModelConfig& config, size_t memory_bytes, int block_size,
                         DType dtype);

// A --kv-cache-dtype value: "auto" (nullopt: the backend's activation dtype), "bfloat16" or
// "float32" (float16 is refused: the kernels do not store it).
Result<std::optional<DType>> parse_kv_cache_dtype(std::string_view name);

class KvCache {
 public:
  // ResourceExhausted when the backend cannot allocate it; InvalidArgument for a bad shape.
  static Result<KvCache> create(Backend& backend, const KvCacheShape& shape);

  const KvCacheShape& shape() const { return shape_; }
  KvCacheView view() const;
  void* data() const { return buffer_.data(); }
  // Where the pool lives (host memory for the CPU backend, device memory for CUDA).
  DeviceKind device() const { return device_; }
  size_t size_bytes() const { return buffer_.size(); }

 private:
  KvCache(KvCacheShape shape, DeviceKind device, DeviceBuffer buffer)
      : shape_(shape), device_(device), buffer_(std::move(buffer)) {}

  KvCacheShape shape_;
  DeviceKind device_;
  DeviceBuffer buffer_;
};

}  // namespace pdserve
