// What a node tells its peers (through the control plane) so they can write into its KV pool:
// its UCX worker address, the packed remote key of its registered pool and the pool's extent.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/status.h"

namespace pdserve::kv_transfer {

struct PeerDescriptor {
  std::vector<std::uint8_t> worker_address;
  std::vector<std::uint8_t> packed_rkey;
  std::uint64_t pool_base = 0;   // remote virtual address of the registered pool
  std::uint64_t pool_bytes = 0;  // its length

  bool operator==(const PeerDescriptor&) const = default;
};

// A self-describing byte string ("PDKV" magic, version, little-endian fields).
std::string serialize_descriptor(const PeerDescriptor& descriptor);
Result<PeerDescriptor> parse_descriptor(std::string_view bytes);

// Standard base64 (RFC 4648, with padding), for text control planes (JSON, HTTP headers).
std::string base64_encode(std::string_view bytes);
Result<std::string> base64_decode(std::string_view text);

}  // namespace pdserve::kv_transfer
