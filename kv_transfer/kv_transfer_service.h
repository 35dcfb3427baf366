// A KvTransferEngine with the thread that drives it (Mooncake / NIXL style): the model's
// thread never waits on the network and the network never waits on a forward step, so UCX
// makes progress (sending, and landing a peer's puts) while the node computes. Commands reach
// the thread through a queue; results come back through callbacks run on that thread, which
// must not block.
//
// Two paths, chosen when the service is created, with the same wire protocol (descriptor,
// puts at the peer's offsets, completion message): direct, where UCX registers the pool itself
// and puts read it (host pools, and GPU pools on a UCX with CUDA memory support); and staged
// (issue #14), where UCX registers a host staging area instead: [landing area | send ring].
// Peers put into the landing area, laid out as a small pool of whole blocks (the connector
// copies landed blocks into the pool, ucx_kv_connector.h); the puts of a stream are copied
// out of the pool into the send ring (send_staging.h) by a PoolCopier and go from there.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/status.h"
#include "common/engine/remote_kv.h"
#include "kv_transfer/kv_transfer_engine.h"
#include "kv_transfer/pool_copier.h"

namespace pdserve::kv_transfer {

// How KV leaves and enters the pool. kAuto: direct for a host pool and for a GPU pool when
// UCX can address CUDA memory, staged otherwise.
enum class TransferPath { kAuto, kDirect, kStaged };

// "auto", "direct" or "staged" (--kv-transfer-path); InvalidArgument otherwise.
Result<TransferPath> parse_transfer_path(std::string_view name);
std::string_view transfer_path_name(TransferPath path);

struct KvTransferServiceOptions {
  std::string transports;  // UCX_TLS ("tcp", "sm,self"); empty: UCX decides
  PoolMemory pool_memory = PoolMemory::kHost;
  TransferPath path = TransferPath::kAuto;
  // The staged path's copies and its staging memory; needed when it is (or may be) chosen.
  std::shared_ptr<PoolCopier> copier{};
  std::uint64_t landing_bytes = 0;  // the landing area (a decode node's)
  std::uint64_t send_bytes = 0;     // the send ring (a prefill node's)
  std::uint64_t staging_unit = 1;   // puts are cut only at multiples of this (a layer-block half)
  // Runs first on the thread that drives UCX: binds it to the pool's device (cudaSetDevice),
  // whose memory UCX's CUDA transports and the staging copies use; create() waits for it and
  // fails with its error. Empty: nothing to bind.
  std::function<Status()> bind_thread{};
};

// On the staged path: the bytes of a put as they passed through the send ring, before the put
// was posted (transfer thread; pool_offset is the pool's, for checksums of the staged copy).
using StagedBytes =
    std::function<void(std::uint64_t pool_offset, const std::byte* data, std::uint64_t bytes)>;

class KvTransferService {
 public:
  // Creates the engine, chooses the path, registers the pool (which must outlive the service)
  // or the staging area, and starts the thread. `on_received` runs on that thread for every
  // completion message that arrives. Unimplemented for a GPU pool on the direct path when UCX
  // cannot address CUDA memory; InvalidArgument for a staged path without a copier or memory.
  static Result<std::unique_ptr<KvTransferService>> create(
      const KvTransferServiceOptions& options, void* pool_base, std::size_t pool_bytes,
      std::function<void(const ReceivedTransfer&)> on_received);
  // Stops the thread; unfinished sends fail (their callbacks run).
  ~KvTransferService();
  KvTransferService(const KvTransferService&) = delete;
  KvTransferService& operator=(const KvTransferService&) = delete;

  // This node's descriptor (serialize_descriptor bytes, base64) for the control plane.
  const std::string& descriptor_base64() const { return descriptor_base64_; }
  // The path chosen, and on the staged path where peers' puts land (landing_bytes() long, at
  // offset 0 of the registered area; null on the direct path).
  bool staged() const;
  std::byte* landing_area() const;
  std::uint64_t landing_bytes() const;
  // The send ring's slots and their size (0 on the direct path), for logs and tests.
  int send_slots() const;
  std::uint64_t send_slot_bytes() const;

  // Sends `copies` to the peer with this descriptor (connected on first use, reconnected
  // after a failure), tagged for the receiver. `done` runs once on the transfer thread.
  void send(std::string peer_descriptor_base64, std::vector<BlockCopy> copies, uint64_t tag,
            std::chrono::milliseconds timeout, std::function<void(const KvTransferReport&)> done);

  // send() in steps, for layer-by-layer sending: open() a stream, put() copies as their data
  // is written (in order, from any thread), close() it after the last; `done` runs once, as
  // for send(). A stream that failed (to connect, a bad range, the deadline) ignores later
  // put() and close(). nullopt, with `done` already called, when the service is stopping.
  // On the staged path the copies' local offsets are pool offsets; a put waits for a free
  // send buffer within the stream's deadline, and `staged` (optional) sees each put's bytes
  // as staged, in put order, before the put goes; close() waits for the last put.
  std::optional<uint64_t> open(std::string peer_descriptor_base64, uint64_t tag,
                               std::chrono::milliseconds timeout,
                               std::function<void(const KvTransferReport&)> done,
                               StagedBytes staged = {});
  void put(uint64_t stream, std::vector<BlockCopy> copies);
  void close(uint64_t stream);
  // Stops a stream whose data will not be complete: no further puts, no completion message;
  // `done` reports it failed (Cancelled) once its issued puts are remotely complete, so no put
  // of it can still land. The peer's other transfers are spared. A stream already closed
  // finishes as usual.
  void abort(uint64_t stream);

  struct Impl;

 private:
  KvTransferService(std::unique_ptr<Impl> impl, std::string descriptor_base64);
  std::unique_ptr<Impl> impl_;
  std::string descriptor_base64_;
};

}  // namespace pdserve::kv_transfer
