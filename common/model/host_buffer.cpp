#include "common/model/host_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace pdserve {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

struct FreeDeleter {
  void operator()(std::byte* pointer) const { std::free(pointer); }
};

}  // namespace

void* allocate_huge_page_aligned(size_t bytes) {
  constexpr size_t kLineAlignment = 64;
  if (bytes < kHugePage) {
    const size_t rounded = (bytes + kLineAlignment - 1) / kLineAlignment * kLineAlignment;
    return std::aligned_alloc(kLineAlignment, rounded == 0 ? kLineAlignment : rounded);
  }
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* memory = std::aligned_alloc(kHugePage, rounded);
  if (memory != nullptr) ::madvise(memory, rounded, MADV_HUGEPAGE);  // advisory: failure only costs speed
  return memory;
}

std::shared_ptr<std::byte[]> allocate_host_buffer(size_t bytes) {
  void* memory = allocate_huge_page_aligned(bytes);
  if (memory == nullptr) throw std::bad_alloc();
  return std::shared_ptr<std::byte[]>(static_cast<std::byte*>(memory), FreeDeleter{});
}

}  // namespace pdserve
