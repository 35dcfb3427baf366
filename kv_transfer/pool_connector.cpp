#include "kv_transfer/pool_connector.h"

#include "kv_transfer/cuda_pool_copier.h"
#include "kv_transfer/host_pool_copier.h"

namespace pdserve::kv_transfer {

Result<std::unique_ptr<UcxKvConnector>> make_pool_connector(const KvCache& pool,
                                                            UcxKvConnectorOptions options) {
  const bool cuda = pool.device() == DeviceKind::kCuda;
  options.pool_memory = cuda ? PoolMemory::kCuda : PoolMemory::kHost;
  if (!options.copier && cuda) {
    PDS_ASSIGN_OR_RETURN(std::unique_ptr<PoolCopier> copier,
                         make_cuda_pool_copier(pool.data(), pool.size_bytes()));
    options.copier = std::move(copier);
  } else if (!options.copier && options.path == TransferPath::kStaged) {
    options.copier =
        std::make_shared<HostPoolCopier>(static_cast<std::byte*>(pool.data()), pool.size_bytes());
  }
  options.kv_k_scales = pool.scales().k;
  options.kv_v_scales = pool.scales().v;
  Backend& backend = pool.backend();
  options.bind_thread = [&backend] { return backend.bind_current_thread(); };
  return UcxKvConnector::create(options, pool.data(), pool.size_bytes(), pool.layout());
}

}  // namespace pdserve::kv_transfer
