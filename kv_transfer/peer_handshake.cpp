#include "kv_transfer/peer_handshake.h"

#include <algorithm>

namespace pdserve::kv_transfer {

std::uint64_t compare_claim(const PeerDescriptor* local, const HelloMessage& claim,
                            std::span<const std::uint8_t> claimed_rkey) {
  if (local == nullptr) return kNoPool;
  std::uint64_t mismatch = 0;
  if (claim.pool_base != local->pool_base) mismatch |= kPoolBaseDiffers;
  if (claim.pool_bytes != local->pool_bytes) mismatch |= kPoolBytesDiffers;
  if (!std::ranges::equal(claimed_rkey, local->packed_rkey)) mismatch |= kRkeyDiffers;
  return mismatch;
}

std::string describe_mismatch(std::uint64_t mismatch) {
  std::string text;
  const auto add = [&](std::uint64_t bit, const char* name) {
    if ((mismatch & bit) == 0) return;
    if (!text.empty()) text += ", ";
    text += name;
  };
  add(kPoolBaseDiffers, "pool base address");
  add(kPoolBytesDiffers, "pool size");
  add(kRkeyDiffers, "remote key");
  add(kNoPool, "the peer has no registered pool");
  add(kMalformedHello, "the peer could not read the claim");
  return text.empty() ? "none" : text;
}

}  // namespace pdserve::kv_transfer
