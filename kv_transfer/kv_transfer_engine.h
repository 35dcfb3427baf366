// Moves KV blocks from this node's registered pool into a peer's registered pool over UCX
// (TensorRT-LLM / Mooncake style): register the pool once, connect to peers by descriptor,
// submit a batch of one-sided puts, poll the batch. After the puts are flushed the sender
// sends a completion message; the receiver records it and acknowledges, and only that
// acknowledgement marks the transfer done, so the sender never reports success for a peer
// that is gone. Every transfer has a deadline. No hidden threads: the owner's thread calls
// progress(), and the engine is not thread-safe.
//
// A peer's descriptor is a claim until the peer confirms it (peer_handshake.h): connect()
// asks the peer's worker whether the pool base, size and key are the pool it registered, and
// no put to the peer is posted before it says yes. Puts added meanwhile wait (their ranges
// already checked against the claim); a peer that refuses the claim fails with
// PermissionDenied, one that does not answer by the handshake's or a transfer's deadline with
// DeadlineExceeded, and nothing of their transfers reaches UCX.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/core/status.h"
#include "kv_transfer/descriptor.h"

namespace pdserve::kv_transfer {

using PeerId = std::uint64_t;
using TransferId = std::uint64_t;

// One contiguous copy: bytes at pool offset `local_offset` here to `remote_offset` there.
struct BlockCopy {
  std::uint64_t local_offset = 0;
  std::uint64_t remote_offset = 0;
  std::uint64_t bytes = 0;
};

enum class TransferState { kPending, kDone, kFailed };

struct TransferStatus {
  TransferState state = TransferState::kPending;
  Status error;  // why, when kFailed
  // Failed because the peer's descriptor or a range was refused: the peer denied the claimed
  // pool (PermissionDenied) or a put fell outside a pool (InvalidArgument). Nothing of it was
  // put.
  bool refused = false;
};

// Counts for tests and logs, since the engine was created.
struct KvTransferEngineStats {
  std::uint64_t puts_posted = 0;       // ucp_put_nbx calls
  std::uint64_t claims_refused = 0;    // this engine's connects whose peer denied the claim
  std::uint64_t hellos_answered = 0;   // peers' claims this engine answered
  std::uint64_t hellos_refused = 0;    // of them, claims that did not match this pool
};

// What the receiving side learns when a transfer's data has landed in its pool.
struct ReceivedTransfer {
  std::uint64_t request_tag = 0;  // the sender's tag (e.g. the request id)
  std::uint64_t bytes = 0;
  std::uint64_t blocks = 0;
};

// Where a registered region lives.
enum class PoolMemory { kHost, kCuda };

struct KvTransferOptions {
  std::string transports;  // UCX_TLS for this engine ("tcp", "sm,self"); empty: UCX decides
};

class KvTransferEngine {
 public:
  static Result<std::unique_ptr<KvTransferEngine>> create(const KvTransferOptions& options);
  ~KvTransferEngine();
  KvTransferEngine(const KvTransferEngine&) = delete;
  KvTransferEngine& operator=(const KvTransferEngine&) = delete;

  // Registers the region peers write into and local puts read from (once): the node's whole
  // pool, or on the staging path the host staging area (kv_transfer_service.h). The memory
  // must outlive the engine. CUDA memory is registered for zero-copy puts when this UCX build
  // supports it (asked at run time); otherwise Unimplemented, never a host registration of
  // device addresses.
  Status register_pool(void* base, std::size_t bytes, PoolMemory memory = PoolMemory::kHost);
  // Whether this UCX build can put from and into CUDA memory.
  bool supports_cuda_memory() const;
  // This node's worker address, pool key and extent, for the control plane.
  Result<PeerDescriptor> local_descriptor() const;

  // Opens an endpoint to the peer's worker and starts the handshake, which must finish within
  // `handshake_timeout` (and before the deadline of any transfer waiting for it). The claim
  // itself (its key above all) is not used before the peer confirms it.
  static constexpr std::chrono::milliseconds kDefaultHandshakeTimeout{10'000};
  Result<PeerId> connect(const PeerDescriptor& peer,
                         std::chrono::milliseconds handshake_timeout = kDefaultHandshakeTimeout);
  // Whether the peer has confirmed its descriptor (puts to it are being posted).
  bool peer_confirmed(PeerId peer) const;
  // Drops a peer: its pending transfers fail, its endpoint is closed, its id is forgotten.
  Status disconnect(PeerId peer);

  // Starts the puts of `copies` to `peer`, tagged `request_tag` for the receiver. The ranges are
  // checked against both pools (the peer's as confirmed by the handshake; until it is, the
  // puts wait). The local ranges must not be reused until the transfer is
  // done or failed.
  Result<TransferId> submit_puts(PeerId peer, std::span<const BlockCopy> copies,
                                 std::uint64_t request_tag, std::chrono::milliseconds timeout);
  // The same in steps, for layer-by-layer sending: open_transfer(), add_puts() as the data
  // becomes ready (each range checked; a bad one fails the transfer with InvalidArgument and
  // nothing of the call is issued), then close_transfer() flushes and sends the completion
  // message.
  // An open transfer has its deadline too. FailedPrecondition for a transfer not open (closed,
  // failed or unknown).
  Result<TransferId> open_transfer(PeerId peer, std::uint64_t request_tag,
                                   std::chrono::milliseconds timeout);
  // `on_released`, when given, runs exactly once, from a later call of this engine on the
  // owner's thread (progress(), disconnect(), poll(), or add_puts itself when it fails), once
  // UCX reads the local bytes of these puts no more: they completed locally, or their transfer
  // failed and its operations ended. The staging path reuses a bounce buffer after it.
  Status add_puts(TransferId id, std::span<const BlockCopy> copies,
                  std::function<void()> on_released = {});
  Status close_transfer(TransferId id);
  // Stops one transfer and spares the peer's others: no further puts are accepted, no
  // completion message is sent, and the transfer fails (Cancelled) once the puts already
  // issued are remotely complete (an endpoint flush), so that when poll() reports it, none of
  // its puts can still land. A transfer whose completion message is already out finishes as
  // usual (FailedPrecondition); NotFound for an unknown id. A cancelled transfer still
  // flushing at its deadline fails its peer.
  Status cancel_transfer(TransferId id);
  // Whether the peer is connected and has not failed (a failed peer must be connected again).
  bool peer_usable(PeerId peer) const;
  // Whether UCX reports this peer's failure itself. Then a transfer past its deadline fails
  // alone (DeadlineExceeded, after a short flush of its issued puts); otherwise the deadline is
  // the only failure detector and fails the peer with all its transfers.
  bool detects_peer_failure(PeerId peer) const;
  // The transfer's state. A finished transfer (done or failed) is reported once, then
  // forgotten; NOT_FOUND for an unknown id.
  Result<TransferStatus> poll(TransferId id);

  // Advances UCX and every transfer (stages, deadlines, acknowledgements); true when UCX
  // made progress (more may follow at once).
  bool progress();
  // Completion messages received since the last call, in arrival order.
  std::vector<ReceivedTransfer> take_received();
  KvTransferEngineStats stats() const;

 private:
  struct Impl;
  explicit KvTransferEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdserve::kv_transfer
