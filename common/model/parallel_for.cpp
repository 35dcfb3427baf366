#include "common/model/parallel_for.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <exception>

namespace pdserve {

// OpenMP, like the kernels: one threading runtime in the process.
void parallel_for(size_t count, size_t grain, const std::function<void(size_t, size_t)>& fn,
                  unsigned threads) {
  if (count == 0) return;
  grain = std::max<size_t>(grain, 1);
  const size_t chunks = (count + grain - 1) / grain;
  if (threads == 0) threads = static_cast<unsigned>(std::max(1, omp_get_num_procs()));
  const int workers = static_cast<int>(std::min<size_t>(threads, chunks));

  std::atomic<bool> failed{false};
  std::exception_ptr first_error;
#pragma omp parallel for schedule(dynamic, 1) num_threads(workers)
  for (size_t chunk = 0; chunk < chunks; ++chunk) {
    if (failed.load(std::memory_order_relaxed)) continue;  // stop doing work after an error
    try {
      fn(chunk * grain, std::min(count, (chunk + 1) * grain));
    } catch (...) {
#pragma omp critical(pdserve_parallel_for_error)
      if (!first_error) first_error = std::current_exception();
      failed.store(true, std::memory_order_relaxed);
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace pdserve
