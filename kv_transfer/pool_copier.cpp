#include "kv_transfer/pool_copier.h"

#include <string>

namespace pdserve::kv_transfer {

Status validate_pool_copies(std::span<const PoolCopy> copies, std::uint64_t pool_bytes) {
  if (copies.empty()) return invalid_argument("pool copy: an empty batch");
  for (const PoolCopy& copy : copies) {
    if (copy.bytes == 0 || copy.host == nullptr || copy.pool_offset > pool_bytes ||
        copy.bytes > pool_bytes - copy.pool_offset) {
      return invalid_argument("pool copy: " + std::to_string(copy.bytes) +
                              " bytes at pool offset " + std::to_string(copy.pool_offset) +
                              " do not fit a pool of " + std::to_string(pool_bytes) + " bytes");
    }
  }
  return Status::ok_status();
}

}  // namespace pdserve::kv_transfer
