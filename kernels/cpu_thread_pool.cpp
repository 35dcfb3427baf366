#include "kernels/cpu_thread_pool.h"

#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace pdserve {
namespace {

// How long an idle helper polls before it sleeps: longer than the gaps between the operations
// of a forward pass (microseconds), shorter than a scheduler time slice.
constexpr int kSpinsBeforeSleep = 20000;
// How long the caller polls for the helpers' last items before it naps (~100 us).
constexpr int kCallerSpins = 4000;
constexpr int kItemBits = 20;
constexpr uint64_t kItemMask = (uint64_t{1} << kItemBits) - 1;

uint32_t epoch_of(uint64_t state) {
  return static_cast<uint32_t>(state >> (2 * kItemBits));
}
int64_t count_of(uint64_t state) {
  return static_cast<int64_t>((state >> kItemBits) & kItemMask);
}
int64_t next_of(uint64_t state) {
  return static_cast<int64_t>(state & kItemMask);
}
uint32_t next_epoch(uint64_t state) {
  return (epoch_of(state) + 1) & 0xFFFFFFu;
}
uint64_t pack(uint32_t epoch, int64_t count) {
  return (uint64_t{epoch} << (2 * kItemBits)) | (static_cast<uint64_t>(count) << kItemBits);
}

void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

}  // namespace

CpuThreadPool::CpuThreadPool(int num_threads) {
  for (int i = 1; i < num_threads; ++i) helpers_.emplace_back([this] { helper_loop(); });
}

CpuThreadPool::~CpuThreadPool() {
  stopping_.store(true);
  // A new epoch with no items wakes the helpers, which then see stopping_.
  state_.store(pack(next_epoch(state_.load()), 0));
  state_.notify_all();
  for (std::thread& helper : helpers_) helper.join();
}

bool CpuThreadPool::claim(uint32_t epoch, int64_t& item) {
  uint64_t state = state_.load(std::memory_order_acquire);
  while (epoch_of(state) == epoch && next_of(state) < count_of(state)) {
    if (state_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel)) {
      item = next_of(state);
      return true;
    }
  }
  return false;
}

// context_ and trampoline_ belong to `epoch` while a claimed item of it is unfinished: the
// caller publishes the next job only after done_ reached the item count.
void CpuThreadPool::work_on(uint32_t epoch) {
  int64_t item = 0;
  while (claim(epoch, item)) {
    trampoline_(context_, item);
    done_.fetch_add(1, std::memory_order_release);
  }
}

void CpuThreadPool::run_job(int64_t count, void* context, Trampoline trampoline) {
  context_ = context;
  trampoline_ = trampoline;
  done_.store(0, std::memory_order_relaxed);
  const uint32_t epoch = next_epoch(state_.load(std::memory_order_relaxed));
  state_.store(pack(epoch, count));  // sequentially consistent with the sleepers_ check
  if (sleepers_.load() > 0) state_.notify_all();
  work_on(epoch);
  // Only items a helper claimed can still be running. A helper that is still at it after the
  // spin was most likely preempted by another process on its core: the caller then sleeps in
  // short naps, leaving its own core idle, so that the scheduler can move the helper there.
  for (int spin = 0; done_.load(std::memory_order_acquire) < count; ++spin) {
    if (spin < kCallerSpins) {
      cpu_relax();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

void CpuThreadPool::helper_loop() {
  // Epoch 0 is the state at construction, not whatever a late-starting helper reads now (that
  // could already be the destructor's).
  uint32_t seen = 0;
  while (true) {
    uint64_t state = state_.load(std::memory_order_acquire);
    for (int spin = 0; epoch_of(state) == seen && spin < kSpinsBeforeSleep; ++spin) {
      cpu_relax();
      state = state_.load(std::memory_order_acquire);
    }
    if (epoch_of(state) == seen) {
      sleepers_.fetch_add(1);
      state = state_.load();
      while (epoch_of(state) == seen) {
        state_.wait(state);
        state = state_.load();
      }
      sleepers_.fetch_sub(1);
    }
    if (stopping_.load()) return;
    seen = epoch_of(state);
    work_on(seen);
  }
}

}  // namespace pdserve
