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

// The pool's memory (host or CUDA) decides how it is registered; Unimplemented for a CUDA pool
// when this UCX build cannot address CUDA memory (see KvTransferEngine::register_pool).
Result<std::unique_ptr<UcxKvConnector>> make_pool_connector(const KvCache& pool,
                                                            UcxKvConnectorOptions options);

}  // namespace pdserve::kv_transfer
