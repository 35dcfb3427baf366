// The CUDA implementation of PoolCopier (pool_copier.h) for a GPU KV pool on the staging path:
// cudaMemcpyAsync on a non-blocking copy stream of its own (so copies overlap the forward on
// the compute stream), one event per batch polled with cudaEventQuery, a host callback per
// batch for set_on_finished, and pinned (cudaHostAlloc, portable) staging memory. Every call
// first makes the pool's device current on the calling thread, so any thread may use it.
// Builds without CUDA answer Unimplemented.
#pragma once

#include <cstdint>
#include <memory>

#include "kv_transfer/pool_copier.h"

namespace pdserve::kv_transfer {

// `pool` must be CUDA device memory (its device is asked of the driver); InvalidArgument
// otherwise, Unavailable when the stream cannot be created.
Result<std::unique_ptr<PoolCopier>> make_cuda_pool_copier(void* pool, std::uint64_t pool_bytes);

}  // namespace pdserve::kv_transfer
