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

  struct Impl;

 private:
  KvTransferService(std::unique_ptr<Impl> impl, std::string descriptor_base64);
  std::unique_ptr<Impl> impl_;
  std::string descriptor_base64_;
};

}  // namespace pdserve::kv_transfer
