// The KvConnector of a disaggregated node over a KvTransferService (UCX), both sides:
//  * export (prefill node): turns the prompt's block table into one-sided puts into the decode
//    node's blocks (per layer, K and V, consecutive blocks merged into one put), posts each
//    layer's puts as soon as the forward reports that layer written (layer-wise, the default)
//    or all of them after the forward, sends the completion message after the last layer and
//    the first token, and reports the outcome (KvTransferReport: layers, layers_overlapped) to
//    the request's on_finished and, with kExportReleased, to the engine;
//  * import (decode node): a RemotePrefillClient (remote_prefill_client.h) asks the request's
//    prefill nodes for the KV (HTTP, failover, the RemotePrefillState of each import); this
//    connector tells the client where its pool is, passes it each transfer's completion
//    message, and checksums the blocks as they landed (with checksums on, the default:
//    kv_checksum.h).
//
// On the staged path (kv_transfer_service.h; a GPU pool on a UCX without CUDA memory support,
// or --kv-transfer-path staged) the export's puts are staged through the send ring, and the
// checksums are computed from the staged bytes as they pass (BlockChecksumStream). An import
// first takes blocks of the landing area (waiting for them, first come first served, within
// the transfer timeout, or failing at once when the area can never hold it: the engine then
// prefills locally); the prefill node writes those, the checksums are verified there, and the
// ready import's blocks are copied into the pool (PoolCopier) before kImportReady goes to the
// engine. Its landing blocks are freed with kImportReleased, after that copy. Checksums on a
// GPU pool on the direct (zero-copy) path: none (the host cannot read the pool).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/core/kv_layout.h"
#include "common/engine/kv_connector.h"
#include "common/protocol/prefill_protocol.h"
#include "kv_transfer/kv_transfer_service.h"
#include "kv_transfer/pool_copier.h"
#include "kv_transfer/remote_prefill_client.h"

namespace pdserve::kv_transfer {

struct UcxKvConnectorOptions {
  std::string transports;  // UCX_TLS ("tcp", "sm,self"; empty: UCX decides)
  PoolMemory pool_memory = PoolMemory::kHost;
  TransferPath path = TransferPath::kAuto;
  // The staged path's copies between the pool and host memory (and the device binding of the
  // transfer thread for a GPU pool); needed unless the path is direct.
  std::shared_ptr<PoolCopier> copier;
  // Staging memory: the send ring (exports) and the landing area (imports; whole blocks of
  // the pool's layout, rounded down). Only allocated on the staged path.
  std::uint64_t staging_send_bytes = 0;
  std::uint64_t staging_receive_bytes = 0;
  std::string cluster_token;
  std::chrono::milliseconds transfer_timeout{30'000};
  // After a failed import whose sender may still be writing: deadline + this, then release.
  std::chrono::milliseconds release_grace{2'000};
  int http_threads = 1;
  // Test only (PDSERVE_TEST_KV_CORRUPT_EVERY on a decode node): flip one byte of every Nth
  // imported block after it landed and before its checksum is verified; 0: never.
  int test_corrupt_every = 0;
  // Binds the UCX thread to the pool's device (KvTransferServiceOptions::bind_thread).
  std::function<Status()> bind_thread = {};
  // An FP8 pool's per-layer scales (empty: 1.0; make_pool_connector sets them from the pool):
  // the prefill work names them and a prefill node with others refuses it.
  std::vector<float> kv_k_scales = {};
  std::vector<float> kv_v_scales = {};
};

class UcxKvConnector : public KvConnector {
 public:
  // Registers [pool_base, pool_base + pool_bytes) with UCX. Unavailable when UCX cannot start.
  static Result<std::unique_ptr<UcxKvConnector>> create(const UcxKvConnectorOptions& options,
                                                        void* pool_base, std::size_t pool_bytes,
                                                        const KvLayout& layout);
  ~UcxKvConnector() override;

  const KvLayout& layout() const;
  // The pool's blocks as prefill work names them: layout and FP8 scales.
  KvBlockLayout block_layout() const;
  const std::string& descriptor_base64() const;
  // Whether the staged path was chosen; the landing area's size in blocks (0 on the direct
  // path).
  bool staged() const;
  int landing_blocks() const;

  void set_wakeup(std::function<void()> wakeup) override;
  Status start_export(const std::string& request_id, const KvExportTarget& target,
                      std::span<const int32_t> block_table, int num_prompt_tokens) override;
  void layer_written(int layer) override;
  void finish_export(const std::string& request_id) override;
  void abort_export(const std::string& request_id) override;
  // Layer-by-layer sending (on by default); off: every put after the forward. Takes effect
  // for exports started afterwards.
  void set_layerwise(bool layerwise);
  // Whether imports ask for block checksums and verify them (on by default; always off for a
  // CUDA pool on the direct path). Takes effect for imports started afterwards.
  void set_kv_checksum(bool on);
  Status start_import(const InferenceRequest& request, std::span<const int32_t> block_table,
                      int num_cached_tokens) override;
  void cancel_import(const std::string& request_id) override;
  std::vector<KvEvent> poll() override;

  struct Impl;

 private:
  explicit UcxKvConnector(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace pdserve::kv_transfer
