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

std::shared_ptr<std::byte[]> allocate_host_buffer(size_t bytes) {
  if (bytes < kHugePage) return std::shared_ptr<std::byte[]>(new std::byte[bytes == 0 ? 1 : bytes]);
  size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* memory = std::aligned_alloc(kHugePage, rounded);
  if (memory == nullptr) throw std::bad_alloc();
  ::madvise(memory, rounded, MADV_HUGEPAGE);  // advisory: failure only costs speed
  return std::shared_ptr<std::byte[]>(static_cast<std::byte*>(memory), FreeDeleter{});
}

}  // namespace pdserve
