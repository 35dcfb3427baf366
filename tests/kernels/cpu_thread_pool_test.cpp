// CpuThreadPool: every item of every job runs exactly once, on any number of threads, for jobs
// back to back (helpers that slept or spun), and the caller alone runs jobs it cannot share.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "kernels/cpu_thread_pool.h"

namespace pdserve {
namespace {

TEST(CpuThreadPool, EveryItemRunsExactlyOnce) {
  for (int threads : {1, 2, 4}) {
    CpuThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t count : {0, 1, 2, 3, 7, 100, 10000}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(count));
      pool.run(count, [&](int64_t item) { runs[static_cast<size_t>(item)].fetch_add(1); });
      for (int64_t item = 0; item < count; ++item) {
        ASSERT_EQ(runs[static_cast<size_t>(item)].load(), 1)
            << threads << " threads, item " << item << " of " << count;
      }
    }
  }
}

TEST(CpuThreadPool, JobsBackToBackAndAfterTheHelpersSlept) {
  CpuThreadPool pool(3);
  std::atomic<int64_t> total{0};
  int64_t expected = 0;
  for (int job = 0; job < 20000; ++job) {
    const int64_t count = job % 13;
    pool.run(count, [&](int64_t item) { total.fetch_add(item + 1); });
    expected += count * (count + 1) / 2;
    if (job % 5000 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // helpers sleep
  }
  EXPECT_EQ(total.load(), expected);
}

TEST(CpuThreadPool, ItemsRunConcurrently) {
  // Item 0 waits (bounded) for item 1: only a second thread can let it finish early.
  CpuThreadPool pool(2);
  std::atomic<bool> second_ran{false};
  bool saw_second = false;
  for (int attempt = 0; attempt < 20 && !saw_second; ++attempt) {
    second_ran = false;
    pool.run(2, [&](int64_t item) {
      if (item == 1) {
        second_ran = true;
        return;
      }
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
      while (!second_ran && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
      saw_second = saw_second || second_ran;
    });
  }
  EXPECT_TRUE(saw_second);
}

TEST(CpuThreadPool, OversizedJobsRunOnTheCaller) {
  CpuThreadPool pool(2);
  const auto caller = std::this_thread::get_id();
  int64_t elsewhere = 0;
  int64_t runs = 0;
  pool.run(CpuThreadPool::kMaxItems + 1, [&](int64_t) {
    ++runs;  // not atomic: only the caller may run these
    if (std::this_thread::get_id() != caller) ++elsewhere;
  });
  EXPECT_EQ(runs, CpuThreadPool::kMaxItems + 1);
  EXPECT_EQ(elsewhere, 0);
}

}  // namespace
}  // namespace pdserve
