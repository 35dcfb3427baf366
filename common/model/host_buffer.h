// Owned host memory for converted weights.
#pragma once

#include <cstddef>
#include <memory>

namespace pdserve {

// An uninitialised buffer of `bytes`. Large buffers are 2 MiB aligned and advised to use
// transparent huge pages: filling gigabytes of fresh 4 KiB pages is dominated by page faults.
// Throws std::bad_alloc when memory is exhausted.
std::shared_ptr<std::byte[]> allocate_host_buffer(size_t bytes);

}  // namespace pdserve
