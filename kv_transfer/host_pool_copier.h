// The host implementation of PoolCopier (pool_copier.h): the pool is host memory (a CPU
// backend's pool), the copies are memcpy on a worker thread, so that they finish later than
// start() returns, as a device's do. With `reorder`, queued batches are picked at random
// (seeded), so the staging path meets batches completing out of order in tests. Used by the
// staging path on CPU pools (--kv-transfer-path staged) and by its tests.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "kv_transfer/pool_copier.h"

namespace pdserve::kv_transfer {

struct HostPoolCopierOptions {
  bool reorder = false;  // finish queued batches in a random order
  std::uint32_t seed = 1;
  std::chrono::microseconds delay{0};  // before each batch (to widen races in tests)
};

class HostPoolCopier final : public PoolCopier {
 public:
  // `pool` (pool_bytes long) must outlive the copier.
  HostPoolCopier(std::byte* pool, std::uint64_t pool_bytes, HostPoolCopierOptions options = {});
  // Waits for the batch being copied; queued ones are dropped.
  ~HostPoolCopier() override;
  HostPoolCopier(const HostPoolCopier&) = delete;
  HostPoolCopier& operator=(const HostPoolCopier&) = delete;

  std::string description() const override { return "host"; }
  std::uint64_t pool_bytes() const override { return pool_bytes_; }
  Result<StagingMemory> allocate_staging(std::size_t bytes) override;
  Result<CopyBatchId> start(CopyDirection direction, std::span<const PoolCopy> copies) override;
  Result<bool> finished(CopyBatchId batch) override;
  void set_on_finished(std::function<void()> notify) override;

  // Tests: while paused, no batch is copied (they queue), so staging buffers stay busy.
  void set_paused(bool paused);
  // Batches completed so far.
  std::uint64_t batches_done() const;

 private:
  struct Batch {
    CopyDirection direction = CopyDirection::kToHost;
    std::vector<PoolCopy> copies;
  };
  void run();

  std::byte* pool_;
  std::uint64_t pool_bytes_;
  HostPoolCopierOptions options_;
  std::mt19937 rng_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::map<CopyBatchId, Batch> queued_;
  std::map<CopyBatchId, bool> states_;  // started batches: finished yet?
  CopyBatchId next_batch_ = 1;
  std::uint64_t done_ = 0;
  bool paused_ = false;
  bool stopping_ = false;
  std::function<void()> notify_;
  std::thread worker_;  // last: started after everything it reads
};

}  // namespace pdserve::kv_transfer
