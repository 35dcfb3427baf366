// allocate_huge_page_aligned: the alignment it promises, and, for large buffers, the
// MADV_HUGEPAGE advice the kernel recorded for the mapping (the "hg" flag of /proc/self/smaps),
// which is what lets the KV pool use transparent huge pages where THP is in "madvise" mode.
#include "common/model/host_buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

namespace pdserve {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

struct Freed {
  void operator()(void* p) const { std::free(p); }
};

// The VmFlags line of the /proc/self/smaps entry that contains `address`.
std::string vm_flags_of(const void* address) {
  const auto target = reinterpret_cast<uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0;
    uintptr_t end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> begin >> dash >> end && dash == '-' && line.find(':') > line.find(' ')) {
      inside = begin <= target && target < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

bool thp_in_kernel() {
  return std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good();
}

TEST(HostBuffer, SmallBuffersAreCacheLineAligned) {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{4096}, kHugePage - 1}) {
    std::unique_ptr<void, Freed> memory(allocate_huge_page_aligned(bytes));
    ASSERT_NE(memory, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(memory.get()) % 64, 0u) << bytes;
    std::memset(memory.get(), 0xAB, bytes);  // all of it is ours (ASan checks the bounds)
  }
}

TEST(HostBuffer, LargeBuffersAreHugePageAlignedAndAdvised) {
  const size_t bytes = 3 * kHugePage + 123;
  std::unique_ptr<void, Freed> memory(allocate_huge_page_aligned(bytes));
  ASSERT_NE(memory, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(memory.get()) % kHugePage, 0u);
  std::memset(memory.get(), 0xCD, bytes);
  const std::string flags = vm_flags_of(memory.get());
  ASSERT_FALSE(flags.empty()) << "no /proc/self/smaps entry holds the buffer";
  if (!thp_in_kernel()) {
    // A kernel without THP refuses the advice (and it costs nothing but speed).
    EXPECT_EQ(flags.find(" hg"), std::string::npos) << flags;
    return;
  }
  EXPECT_NE(flags.find(" hg"), std::string::npos) << "not advised MADV_HUGEPAGE: " << flags;
}

TEST(HostBuffer, TheSharedBufferIsTheSameMemory) {
  const std::shared_ptr<std::byte[]> buffer = allocate_host_buffer(kHugePage + 1);
  ASSERT_NE(buffer, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.get()) % kHugePage, 0u);
  EXPECT_EQ(vm_flags_of(buffer.get()).find(" hg") != std::string::npos, thp_in_kernel());
}

}  // namespace
}  // namespace pdserve
