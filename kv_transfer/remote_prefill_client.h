// The decode side of a remote prefill, without the transport: for each imported request it
// sends PrefillWork to the request's prefill nodes in order (HTTP, cluster token), reads the
// answer's events (first token, then kv_sent / kv_failed), and decides with a
// RemotePrefillState (remote_prefill_state.h) what to report to the engine and when the
// request's reserved blocks may be freed. It moves no KV: its owner (UcxKvConnector) names
// where the prefill node must write (ImportDestination), reports each transfer's completion
// message (landed(tag)), and checksums the blocks as they landed (LandedChecksums), so tests
// drive it with a fake prefill node and no UCX.
//
// Failover: a prefill node that refuses the work, or cannot be reached before anything was
// sent, passes it to the next one; so does KV whose checksums do not match (a re-fetch: the
// engine keeps the first token it already has, the next node rewrites the same blocks under a
// new transfer tag; the mismatch counts in RemotePrefillStats::checksum_mismatches). With no
// next node the import fails and the engine prefills the request itself.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/core/kv_layout.h"
#include "common/core/status.h"
#include "common/engine/kv_connector.h"
#include "common/protocol/prefill_protocol.h"

namespace pdserve::kv_transfer {

struct RemotePrefillOptions {
  std::string cluster_token;
  std::chrono::milliseconds transfer_timeout{30'000};
  // After a failed import whose sender may still be writing: deadline + this, then release.
  std::chrono::milliseconds release_grace{2'000};
  int http_threads = 1;
  // Whether imports ask for block checksums and verify them (set_kv_checksum changes it).
  bool verify_checksums = true;
  // Test only (a fault hook): runs on the HTTP thread once a work's connection is up, just
  // before its bytes go out and before the import hears of it. A test blocks in it to give the
  // import up while its work is on the way.
  std::function<void(const std::string& request_id)> test_before_work_sent;
  // Test only: runs on the HTTP thread once a work's response head has been applied to its
  // import (kPrefilling after a 200), so that a test acts on an import in that state.
  std::function<void(const std::string& request_id)> test_after_head;
};

// Where a prefill node writes this node's blocks: the PrefillWork fields that name the pool.
struct ImportDestination {
  std::string kv_descriptor;  // base64, the transport's (descriptor.h)
  KvLayout pool;
  // An FP8 pool's per-layer scales (empty: 1.0), part of the layout a prefill node must share.
  std::vector<float> k_scales = {};
  std::vector<float> v_scales = {};
};

// Checksums of prompt blocks first_block.. as they landed here, in `blocks` (kv_checksum.h's
// prompt_block_checksums over this node's pool). Called on the engine thread, from poll().
using LandedChecksums = std::function<std::vector<uint64_t>(
    std::span<const int32_t> blocks, int first_block, int num_prompt_tokens)>;

class RemotePrefillClient {
 public:
  static Result<std::unique_ptr<RemotePrefillClient>> create(const RemotePrefillOptions& options,
                                                             ImportDestination destination,
                                                             LandedChecksums landed_checksums);
  // Stops the HTTP calls; their last callbacks start nothing new.
  ~RemotePrefillClient();

  // The engine's wakeup: called when poll() has something (events, blocks to verify or free).
  void set_wakeup(std::function<void()> wakeup);
  // For imports started afterwards.
  void set_kv_checksum(bool on);

  // KvConnector::start_import: `block_table` covers the prompt; blocks before
  // num_cached_tokens / block_size are cached here and not transferred.
  Status start(const InferenceRequest& request, std::span<const int32_t> block_table,
               int num_cached_tokens);
  // KvConnector::cancel_import.
  void cancel(const std::string& request_id);
  // The transport received the completion message of the transfer with this tag: every put of
  // it has landed. Any thread.
  void landed(uint64_t tag);
  // Engine thread: verifies landed blocks, enforces deadlines, returns the events since the
  // last poll (kFirstToken, kImportReady, kImportFailed, kImportReleased). A kImportReleased
  // whose status is DeadlineExceeded freed blocks held until the hold deadline: nothing
  // confirmed that no put could land (logged once, with the request id, blocks and why).
  std::vector<KvEvent> poll();

  struct Impl;

 private:
  explicit RemotePrefillClient(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace pdserve::kv_transfer
