// A KvTransferEngine with the thread that drives it (Mooncake / NIXL style): the model's
// thread never waits on the network and the network never waits on a forward step, so UCX
// makes progress (sending, and landing a peer's puts) while the node computes. Commands reach
// the thread through a queue; results come back through callbacks run on that thread, which
// must not block.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/core/status.h"
#include "common/engine/remote_kv.h"
#include "kv_transfer/kv_transfer_engine.h"

namespace pdserve::kv_transfer {

class KvTransferService {
 public:
  // Creates the engine, registers the pool (which must outlive the service) and starts the
  // thread. `on_received` runs on that thread for every completion message that arrives.
  static Result<std::unique_ptr<KvTransferService>> create(
      const KvTransferOptions& options, void* pool_base, std::size_t pool_bytes,
      std::function<void(const ReceivedTransfer&)> on_received);
  // Stops the thread; unfinished sends fail (their callbacks run).
  ~KvTransferService();
  KvTransferService(const KvTransferService&) = delete;
  KvTransferService& operator=(const KvTransferService&) = delete;

  // This node's descriptor (serialize_descriptor bytes, base64) for the control plane.
  const std::string& descriptor_base64() const { return descriptor_base64_; }

  // Sends `copies` to the peer with this descriptor (connected on first use, reconnected
  // after a failure), tagged for the receiver. `done` runs once on the transfer thread.
  void send(std::string peer_descriptor_base64, std::vector<BlockCopy> copies, uint64_t tag,
            std::chrono::milliseconds timeout, std::function<void(const KvTransferReport&)> done);

  // send() in steps, for layer-by-layer sending: open() a stream, put() copies as their data
  // is written (in order, from any thread), close() it after the last; `done` runs once, as
  // for send(). A stream that failed (to connect, a bad range, the deadline) ignores later
  // put() and close(). nullopt, with `done` already called, when the service is stopping.
  std::optional<uint64_t> open(std::string peer_descriptor_base64, uint64_t tag,
                               std::chrono::milliseconds timeout,
                               std::function<void(const KvTransferReport&)> done);
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
