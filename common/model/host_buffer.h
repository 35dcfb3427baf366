// Owned host memory for converted weights.
#pragma once

#include <cstddef>
#include <memory>

namespace pdserve {

// Uninitialised memory of `bytes`, released with std::free; nullptr when memory is exhausted.
// 64-byte aligned; from 2 MiB up, 2 MiB aligned and advised to use transparent huge pages
// (where the kernel's THP mode is "madvise", the default of many distributions, nothing else
// gets them): a buffer read at scattered places, as the paged KV pool is, otherwise misses the
// TLB on almost every 4 KiB page it touches.
void* allocate_huge_page_aligned(size_t bytes);

// An uninitialised buffer of `bytes`. Large buffers are 2 MiB aligned and advised to use
// transparent huge pages: filling gigabytes of fresh 4 KiB pages is dominated by page faults.
// Throws std::bad_alloc when memory is exhausted.
std::shared_ptr<std::byte[]> allocate_host_buffer(size_t bytes);

}  // namespace pdserve
