// Glue between a node's KV pool (kernels/model/kv_cache.h) and the UCX connector: the block
// layout both sides of a transfer must share, and the connector over the pool.
#pragma once

#include <memory>

#include "common/protocol/prefill_protocol.h"
#include "kernels/model/kv_cache.h"
#include "kv_transfer/ucx_kv_connector.h"

namespace pdserve::kv_transfer {

KvBlockLayout kv_block_layout(const KvCacheShape& shape);
PoolLayout pool_layout(const KvCacheShape& shape);

// InvalidArgument for a pool the transfer layer cannot address (not host memory yet).
Result<std::unique_ptr<UcxKvConnector>> make_pool_connector(const KvCache& pool,
                                                            const UcxKvConnectorOptions& options);

}  // namespace pdserve::kv_transfer
