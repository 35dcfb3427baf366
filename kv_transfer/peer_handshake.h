// The KV peer handshake (issue #34): before any put to a peer, the sender asks the peer itself
// to confirm the pool it was told about. A work request's descriptor is only a claim: a forged
// one could name any address, size or key, and UCX writes wherever it is told (over tcp its
// emulated puts check no key). So the sender sends the claim (pool base, pool bytes, packed
// remote key) to the worker it names, and posts puts only once that worker answers that the
// claim is, byte for byte, the pool it registered; every range is then checked against it.
// The wire format lives here, free of UCX; kv_transfer_engine.cpp sends and answers it.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "kv_transfer/descriptor.h"

namespace pdserve::kv_transfer {

// Active message ids of the engine's wire protocol (kv_transfer/README.md, "Protocol").
inline constexpr unsigned kCompletionAmId = 1;
inline constexpr unsigned kAckAmId = 2;
inline constexpr unsigned kHelloAmId = 3;
inline constexpr unsigned kHelloReplyAmId = 4;

inline constexpr std::uint64_t kHelloMagic = 0x4f4c4c4548564b50;  // "PKVHELLO", little-endian
// A packed remote key longer than this is refused (tcp's and shared memory's are tens of
// bytes, RDMA's a few hundred).
inline constexpr std::size_t kMaxPackedRkeyBytes = 4096;

// Sender to peer (AM kHelloAmId, with a reply endpoint); the packed key is the AM's data.
struct HelloMessage {
  std::uint64_t magic = kHelloMagic;
  std::uint64_t handshake_id = 0;  // random: a reply must name it
  std::uint64_t pool_base = 0;
  std::uint64_t pool_bytes = 0;
};

// Why a peer refused a claim: a bit per field that differs (0: confirmed).
enum HelloMismatch : std::uint64_t {
  kPoolBaseDiffers = 1u << 0,
  kPoolBytesDiffers = 1u << 1,
  kRkeyDiffers = 1u << 2,
  kNoPool = 1u << 3,          // the peer has registered no pool
  kMalformedHello = 1u << 4,  // the peer could not read the claim
};

// Peer to sender (AM kHelloReplyAmId, on the hello's reply endpoint).
struct HelloReply {
  std::uint64_t handshake_id = 0;
  std::uint64_t mismatch = 0;  // HelloMismatch bits
};

// The peer's side: the bits for a claim against its own pool (`local`; null without one).
std::uint64_t compare_claim(const PeerDescriptor* local, const HelloMessage& claim,
                            std::span<const std::uint8_t> claimed_rkey);

// "pool base, pool size" and so on, for the sender's error.
std::string describe_mismatch(std::uint64_t mismatch);

}  // namespace pdserve::kv_transfer
