#include "kv_transfer/pool_connector.h"

namespace pdserve::kv_transfer {

KvBlockLayout kv_block_layout(const KvCacheShape& shape) {
  return {shape.num_layers, shape.block_size, shape.num_kv_heads, shape.head_dim,
          std::string(dtype_name(shape.dtype))};
}

PoolLayout pool_layout(const KvCacheShape& shape) {
  return {kv_block_layout(shape), shape.num_blocks, dtype_size(shape.dtype)};
}

Result<std::unique_ptr<UcxKvConnector>> make_pool_connector(const KvCache& pool,
                                                            UcxKvConnectorOptions options) {
  options.pool_memory = pool.device() == DeviceKind::kCuda ? PoolMemory::kCuda : PoolMemory::kHost;
  return UcxKvConnector::create(options, pool.data(), pool.size_bytes(), pool_layout(pool.shape()));
}

}  // namespace pdserve::kv_transfer
