#include "kv_transfer/pool_connector.h"

namespace pdserve::kv_transfer {

Result<std::unique_ptr<UcxKvConnector>> make_pool_connector(const KvCache& pool,
                                                            UcxKvConnectorOptions options) {
  options.pool_memory = pool.device() == DeviceKind::kCuda ? PoolMemory::kCuda : PoolMemory::kHost;
  Backend& backend = pool.backend();
  options.bind_thread = [&backend] { return backend.bind_current_thread(); };
  return UcxKvConnector::create(options, pool.data(), pool.size_bytes(), pool.layout());
}

}  // namespace pdserve::kv_transfer
