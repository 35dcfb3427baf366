// Glue between a node's KV pool (kernels/model/kv_cache.h) and the UCX connector.
#pragma once

#include <memory>

#include "kernels/model/kv_cache.h"
#include "kv_transfer/ucx_kv_connector.h"

namespace pdserve::kv_transfer {

// The pool's memory (host or CUDA) decides how it is registered; Unimplemented for a CUDA pool
// when this UCX build cannot address CUDA memory (see KvTransferEngine::register_pool). The
// UCX thread binds itself to the pool's device (its backend's bind_current_thread).
Result<std::unique_ptr<UcxKvConnector>> make_pool_connector(const KvCache& pool,
                                                            UcxKvConnectorOptions options);

}  // namespace pdserve::kv_transfer
