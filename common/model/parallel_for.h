// A blocking parallel loop over an index range, for bulk conversions and generation.
#pragma once

#include <cstddef>
#include <functional>

namespace pdserve {

// Calls fn(begin, end) on disjoint chunks of at most `grain` indices covering [0, count), from
// up to `threads` workers (0: one per hardware thread). Returns when every chunk is done; an
// exception thrown by fn is rethrown here after the workers have stopped.
void parallel_for(size_t count, size_t grain, const std::function<void(size_t, size_t)>& fn,
                  unsigned threads = 0);

}  // namespace pdserve
