// A node's KV pool as the staging path sees it (issue #14): when UCX cannot address the pool
// (a GPU pool on a UCX without CUDA memory support), the KV goes through host staging memory
// that UCX can register, and this interface moves it between the pool and that memory:
// asynchronous copies in batches, each completing as a whole, polled without blocking.
//
// Two implementations: CUDA (cuda_pool_copier.h: cudaMemcpyAsync on a copy stream of its own,
// one event per batch, pinned staging memory) and host (host_pool_copier.h: memcpy on a
// worker thread, optionally completing batches out of order, so that the staging path runs
// end to end in CI on CPU pools and is compared there with the direct path's bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "common/core/status.h"

namespace pdserve::kv_transfer {

enum class CopyDirection { kToHost, kToPool };

// One contiguous copy between `bytes` at `pool_offset` in the pool and `host`.
struct PoolCopy {
  std::uint64_t pool_offset = 0;
  std::byte* host = nullptr;
  std::uint64_t bytes = 0;
};

using CopyBatchId = std::uint64_t;

// Host memory from a PoolCopier (pinned for CUDA); freed with its deleter.
using StagingMemory = std::unique_ptr<std::byte, std::function<void(std::byte*)>>;

// The check every PoolCopier::start makes first: InvalidArgument for an empty batch, an empty
// copy, no host memory, or a range outside a pool of pool_bytes.
Status validate_pool_copies(std::span<const PoolCopy> copies, std::uint64_t pool_bytes);

class PoolCopier {
 public:
  virtual ~PoolCopier() = default;

  // "host" or "cuda:N", for logs.
  virtual std::string description() const = 0;
  virtual std::uint64_t pool_bytes() const = 0;

  // Host memory the copies run at full speed from and UCX can register (page-aligned);
  // ResourceExhausted when it cannot be had.
  virtual Result<StagingMemory> allocate_staging(std::size_t bytes) = 0;

  // Queues `copies` (pool -> host for kToHost) as one batch. InvalidArgument, and nothing
  // queued, for an empty batch, an empty copy, or a pool range outside the pool. The host
  // memory must stay untouched until the batch has finished.
  virtual Result<CopyBatchId> start(CopyDirection direction, std::span<const PoolCopy> copies) = 0;
  // Never blocks: true once every copy of the batch has completed, after which the batch is
  // forgotten (NotFound if asked again); the error of a copy that failed (also forgotten).
  virtual Result<bool> finished(CopyBatchId batch) = 0;

  // Called (from any thread, possibly a driver's) each time a batch completes, so a waiting
  // thread can poll again; it must not block or call into the copier. Set it before start().
  virtual void set_on_finished(std::function<void()> notify) = 0;

  // Makes the pool's device current on the calling thread (cudaSetDevice), for the threads
  // that talk to UCX about device memory; nothing on the host.
  virtual Status bind_thread() { return Status::ok_status(); }
};

}  // namespace pdserve::kv_transfer
