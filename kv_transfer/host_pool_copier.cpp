#include "kv_transfer/host_pool_copier.h"

#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>

namespace pdserve::kv_transfer {
namespace {

constexpr std::size_t kPageBytes = 4096;

}  // namespace

HostPoolCopier::HostPoolCopier(std::byte* pool, std::uint64_t pool_bytes,
                               HostPoolCopierOptions options)
    : pool_(pool), pool_bytes_(pool_bytes), options_(options), rng_(options.seed) {
  worker_ = std::thread([this] { run(); });
}

HostPoolCopier::~HostPoolCopier() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  worker_.join();
}

Result<StagingMemory> HostPoolCopier::allocate_staging(std::size_t bytes) {
  if (bytes == 0) return invalid_argument("staging memory: zero bytes");
  const std::size_t rounded = (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
  void* memory = std::aligned_alloc(kPageBytes, rounded);
  if (memory == nullptr) {
    return resource_exhausted("staging memory: cannot allocate " + std::to_string(bytes) +
                              " bytes");
  }
  return StagingMemory(static_cast<std::byte*>(memory), [](std::byte* data) { std::free(data); });
}

Result<CopyBatchId> HostPoolCopier::start(CopyDirection direction,
                                          std::span<const PoolCopy> copies) {
  PDS_RETURN_IF_ERROR(validate_pool_copies(copies, pool_bytes_));
  CopyBatchId id = 0;
  {
    std::lock_guard lock(mutex_);
    id = next_batch_++;
    queued_.emplace(id, Batch{direction, {copies.begin(), copies.end()}});
    states_.emplace(id, false);
  }
  wake_.notify_all();
  return id;
}

Result<bool> HostPoolCopier::finished(CopyBatchId batch) {
  std::lock_guard lock(mutex_);
  auto it = states_.find(batch);
  if (it == states_.end()) return not_found("pool copy: no batch " + std::to_string(batch));
  if (!it->second) return false;
  states_.erase(it);
  return true;
}

void HostPoolCopier::set_on_finished(std::function<void()> notify) {
  std::lock_guard lock(mutex_);
  notify_ = std::move(notify);
}

void HostPoolCopier::set_paused(bool paused) {
  {
    std::lock_guard lock(mutex_);
    paused_ = paused;
  }
  wake_.notify_all();
}

std::uint64_t HostPoolCopier::batches_done() const {
  std::lock_guard lock(mutex_);
  return done_;
}

void HostPoolCopier::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || (!paused_ && !queued_.empty()); });
    if (stopping_) return;
    auto it = queued_.begin();
    if (options_.reorder) {
      std::uniform_int_distribution<std::size_t> pick(0, queued_.size() - 1);
      std::advance(it, static_cast<std::ptrdiff_t>(pick(rng_)));
    }
    const CopyBatchId id = it->first;
    const Batch batch = std::move(it->second);
    queued_.erase(it);
    lock.unlock();
    if (options_.delay.count() > 0) std::this_thread::sleep_for(options_.delay);
    for (const PoolCopy& copy : batch.copies) {
      std::byte* pool = pool_ + copy.pool_offset;
      if (batch.direction == CopyDirection::kToHost) {
        std::memcpy(copy.host, pool, copy.bytes);
      } else {
        std::memcpy(pool, copy.host, copy.bytes);
      }
    }
    lock.lock();
    states_[id] = true;
    ++done_;
    const std::function<void()> notify = notify_;
    lock.unlock();
    if (notify) notify();
    lock.lock();
  }
}

}  // namespace pdserve::kv_transfer
