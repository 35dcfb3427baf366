#include "common/model/parallel_for.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace pdserve {

void parallel_for(size_t count, size_t grain, const std::function<void(size_t, size_t)>& fn,
                  unsigned threads) {
  if (count == 0) return;
  grain = std::max<size_t>(grain, 1);
  size_t chunks = (count + grain - 1) / grain;
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  size_t workers = std::min<size_t>(threads, chunks);

  std::atomic<size_t> next_chunk{0};
  std::exception_ptr first_error;
  std::mutex error_mutex;
  auto work = [&] {
    for (size_t chunk = next_chunk++; chunk < chunks; chunk = next_chunk++) {
      try {
        fn(chunk * grain, std::min(count, (chunk + 1) * grain));
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
        next_chunk = chunks;  // stop handing out work
      }
    }
  };
  {
    std::vector<std::jthread> pool;
    for (size_t i = 1; i < workers; ++i) pool.emplace_back(work);
    work();
  }
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace pdserve
