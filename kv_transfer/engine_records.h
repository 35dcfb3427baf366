// The engine's records of transfers and peers, the messages of its wire protocol, and the
// small helpers over them (private to kv_transfer_engine.cpp, which is their only user).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/core/status.h"
#include "kv_transfer/kv_transfer_engine.h"
#include "kv_transfer/peer_handshake.h"
#include "kv_transfer/ucx_handles.h"

namespace pdserve::kv_transfer::engine_records {
struct CompletionMessage {
  std::uint64_t transfer_id;
  std::uint64_t request_tag;
  std::uint64_t bytes;
  std::uint64_t blocks;
};

struct AckMessage {
  std::uint64_t transfer_id;
};

// kOpen: puts may still be added (layer-by-layer sending); kPutting: flushing the last ones;
// kCancelling: cancelled, flushing the puts already issued (then kFailed, no completion message).
enum class Stage { kOpen, kPutting, kNotifying, kCancelling, kDone, kFailed };

// Puts whose local bytes their sender wants back (add_puts with on_released): a staging
// buffer is reused once UCX reads it no more.
struct PutGroup {
  std::vector<void*> requests;
  std::function<void()> on_released;
};

// Puts added while the peer's handshake was under way: posted once it confirms its pool.
struct QueuedPuts {
  std::vector<BlockCopy> copies;
  std::function<void()> on_released;
};

struct Transfer {
  PeerId peer = 0;
  Stage stage = Stage::kPutting;
  bool acknowledged = false;
  std::vector<void*> requests;       // outstanding UCX requests of the current stage
  std::vector<PutGroup> put_groups;  // puts issued with a release callback, not yet released
  std::vector<QueuedPuts> queued;    // waiting for the peer's handshake, not issued
  bool close_queued = false;         // closed while waiting: flush after the queued puts
  std::chrono::steady_clock::time_point deadline;
  CompletionMessage message{};  // UCX reads it until the send completes: lives here
  Status error;
  bool refused = false;  // the peer denied its descriptor, or a range was outside a pool
};

// kHandshaking: the endpoint is open and the claim sent; nothing is put until the peer
// confirms it (kReady). A refusal, an unanswered handshake or any failure sets `failure`.
enum class PeerState { kHandshaking, kReady };

struct Peer {
  // What connect() was given. The puts use it only once the peer has confirmed every field
  // that decides where they land (pool base, size, key), so each bounds check below is
  // against the pool the peer registered, whatever a work request claimed.
  PeerDescriptor descriptor;
  PeerState state = PeerState::kHandshaking;
  HelloMessage hello;                         // UCX reads it until the send completes
  std::vector<void*> hello_requests;          // the hello's send
  std::optional<std::uint64_t> hello_answer;  // the reply's mismatch bits, once here
  std::chrono::steady_clock::time_point handshake_deadline;
  std::unique_ptr<UcpEndpoint> endpoint;
  std::unique_ptr<RemoteKey> rkey;  // unpacked once confirmed
  ucs_status_t failure = UCS_OK;    // set by UCX's error callback or a deadline
  Status failure_reason;            // when the engine itself failed it (refusal, handshake)
  bool closed = false;
  // UCX reports this peer's failure itself; otherwise (shared memory in UCX 1.13) a transfer's
  // deadline is the only failure detector and fails the whole peer.
  bool detects_failure = true;
};

// How long a transfer stopped at its deadline may take to flush the puts it issued before its
// peer is failed instead. Well inside the receiver's hold of its blocks after a failure (the
// transfer timeout plus a grace period, ucx_kv_connector.h).
constexpr auto kExpiredFlushGrace = std::chrono::seconds(1);

// A message owed to a sender on its reply endpoint (an acknowledgement, a hello's answer),
// sent from progress() rather than inside the callback. The vector's buffer, which UCX reads
// until the send completes, keeps its address when the vector moves.
struct PendingReply {
  ucp_ep_h reply_endpoint = nullptr;
  unsigned am_id = 0;
  std::vector<std::uint8_t> message;
  void* request = nullptr;
  bool sent = false;
};

template <typename Message>
std::vector<std::uint8_t> message_bytes(const Message& message) {
  std::vector<std::uint8_t> bytes(sizeof message);
  std::memcpy(bytes.data(), &message, sizeof message);
  return bytes;
}

// A peer's claim as it arrived, answered from progress().
struct PendingHello {
  ucp_ep_h reply_endpoint = nullptr;
  HelloMessage claim;
  std::vector<std::uint8_t> rkey;
  bool readable = false;
};

inline void on_peer_error(void* arg, ucp_ep_h /*endpoint*/, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  if (peer->failure == UCS_OK) peer->failure = status;
}

// Frees the requests that finished; the first failure is returned, OK once all have finished.
inline Result<bool> settle(std::vector<void*>& requests) {
  Status failure;
  std::erase_if(requests, [&](void* request) {
    const ucs_status_t status = ucp_request_check_status(request);
    if (status == UCS_INPROGRESS) return false;
    if (status != UCS_OK && failure.ok()) failure = ucx_error(status, "KV transfer operation");
    ucp_request_free(request);
    return true;
  });
  if (!failure.ok()) return failure;
  return requests.empty();
}

inline void free_requests(std::vector<void*>& requests) {
  for (void* request : requests) ucp_request_free(request);
  requests.clear();
}

// Ends every put group of a transfer whose operations are over (finished, or ended by a forced
// endpoint close): UCX reads their local bytes no more.
inline void release_put_groups(Transfer& transfer) {
  std::vector<PutGroup> groups = std::move(transfer.put_groups);
  transfer.put_groups.clear();
  for (PutGroup& group : groups) {
    free_requests(group.requests);
    if (group.on_released) group.on_released();
  }
}

// Keeps a request returned by an nbx call; false with the error when the call failed at once.
inline Status keep_request(ucs_status_ptr_t result, std::vector<void*>& requests,
                           const char* what) {
  if (UCS_PTR_IS_ERR(result)) return ucx_error(UCS_PTR_STATUS(result), what);
  if (result != nullptr) requests.push_back(result);
  return {};
}

inline bool range_fits(std::uint64_t offset, std::uint64_t bytes, std::uint64_t extent) {
  return offset <= extent && bytes <= extent - offset;
}

// Every copy non-empty and inside both pools; InvalidArgument naming the first that is not.
inline Status check_ranges(std::span<const BlockCopy> copies, std::uint64_t local_bytes,
                           std::uint64_t remote_bytes) {
  for (std::size_t i = 0; i < copies.size(); ++i) {
    const BlockCopy& copy = copies[i];
    if (copy.bytes == 0 || !range_fits(copy.local_offset, copy.bytes, local_bytes) ||
        !range_fits(copy.remote_offset, copy.bytes, remote_bytes)) {
      return invalid_argument("add_puts: block " + std::to_string(i) + " (local " +
                              std::to_string(copy.local_offset) + ", remote " +
                              std::to_string(copy.remote_offset) + ", " +
                              std::to_string(copy.bytes) + " bytes) is empty or outside a pool");
    }
  }
  return {};
}

inline bool nothing_issued(const Transfer& transfer) {
  return transfer.requests.empty() && transfer.put_groups.empty() && transfer.message.blocks == 0;
}

// Hands back the puts that waited for the handshake: none of them was issued.
inline void drop_queued(Transfer& transfer) {
  std::vector<QueuedPuts> queued = std::move(transfer.queued);
  transfer.queued.clear();
  transfer.close_queued = false;
  for (QueuedPuts& puts : queued) {
    if (puts.on_released) puts.on_released();
  }
}

}  // namespace pdserve::kv_transfer::engine_records
