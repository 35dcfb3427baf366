// The CPU backend's threads: the calling thread plus num_threads - 1 helpers that share the
// items of one job at a time, claimed one by one from a shared counter.
//
// Why not an OpenMP parallel region per operation: a region ends with a barrier every thread
// must reach, so a helper that the OS has descheduled (another process on its core) stalls
// the caller for a whole time slice, at every one of the ~250 regions of a decode step (a
// 2-thread decode ran 5-10x slower than a 1-thread one on the shared development machine).
// Here the caller waits only for items a helper has actually claimed; items nobody claimed it
// runs itself. Which thread runs an item never changes its arithmetic (every kernel computes
// each output element in one item, in a fixed order), so results stay bitwise reproducible.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace pdserve {

class CpuThreadPool {
 public:
  // The most items one job may have.
  static constexpr int64_t kMaxItems = (int64_t{1} << 20) - 1;

  // num_threads <= 1: no helpers, run() calls the function inline.
  explicit CpuThreadPool(int num_threads);
  ~CpuThreadPool();
  CpuThreadPool(const CpuThreadPool&) = delete;
  CpuThreadPool& operator=(const CpuThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(helpers_.size()) + 1; }

  // Calls fn(item) once for every item in [0, count), on the caller and the helpers; returns
  // when all calls have returned. Not reentrant (one job at a time, from one thread). Jobs of
  // more than kMaxItems items run on the caller alone.
  template <typename Fn>
  void run(int64_t count, Fn&& fn) {
    if (count <= 0) return;
    if (helpers_.empty() || count == 1 || count > kMaxItems) {
      for (int64_t item = 0; item < count; ++item) fn(item);
      return;
    }
    run_job(count, &fn, [](void* context, int64_t item) { (*static_cast<Fn*>(context))(item); });
  }

 private:
  using Trampoline = void (*)(void* context, int64_t item);
  void run_job(int64_t count, void* context, Trampoline trampoline);
  void helper_loop();
  // Claims the next item of the job published as `epoch`; false when the job has none left
  // or is no longer current.
  bool claim(uint32_t epoch, int64_t& item);
  void work_on(uint32_t epoch);

  // The current job's epoch (high 24 bits), item count (20 bits) and next unclaimed item (low
  // 20 bits), in one word: a claim compares all three, so it can never take an item past a
  // job's end or of a newer job.
  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stopping_{false};
  void* context_ = nullptr;
  Trampoline trampoline_ = nullptr;
  std::vector<std::thread> helpers_;
};

}  // namespace pdserve
