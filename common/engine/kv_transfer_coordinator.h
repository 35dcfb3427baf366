// The engine's side of disaggregation (the protocol is kv_connector.h's): starts imports and
// exports on the node's KvConnector, pins the blocks of each transfer and unpins them only on
// the connector's release, so a block is never reused while a put may still land in it
// (import) or read it (export); applies the connector's events; counts the transfers' figures.
// What an import event means for a request still running (its first token streamed, its KV
// landed) is the engine's: the coordinator hands those to an ImportListener, and applies
// itself only what concerns blocks and sequences (a failed import's fallback to a local
// prefill, the import of a request that ended meanwhile). Used on the engine thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/core/status.h"
#include "common/engine/inference_service.h"
#include "common/engine/kv_connector.h"
#include "common/engine/model_executor.h"
#include "common/engine/scheduler.h"

namespace pdserve {

// The engine's requests, as the coordinator sees them when an import event comes.
class ImportListener {
 public:
  virtual ~ImportListener() = default;
  // The sequence of the request, nullopt once it ended (finished or aborted).
  virtual std::optional<SeqId> live_sequence(const std::string& request_id) const = 0;
  // The remotely sampled first token of a live request; its sequence keeps awaiting its KV.
  virtual void import_first_token(const std::string& request_id, SeqId seq_id,
                                  RemotePrefillResult result) = 0;
  // The KV of a live request has landed (`stats`: the whole remote prefill's figures).
  virtual void import_ready(const std::string& request_id, SeqId seq_id,
                            RemotePrefillStats stats) = 0;
};

class KvTransferCoordinator {
 public:
  // `connector` null: a node that moves no KV. Both must outlive the coordinator.
  KvTransferCoordinator(KvConnector* connector, Scheduler& scheduler);

  bool has_connector() const { return connector_ != nullptr; }
  // Transfers whose blocks are still pinned (they may outlive their requests).
  bool has_pinned() const { return !exports_.empty() || !imports_.empty(); }

  // Decode side. Pins the blocks of `seq_id` (reserved by Scheduler::add_imported_request)
  // and starts the import of `request`'s KV: for a resumed stream, of its prompt and its
  // delivered tokens but the last. On error nothing stays pinned and no event will come.
  Status start_import(const InferenceRequest& request, SeqId seq_id);
  bool importing(const std::string& request_id) const { return imports_.contains(request_id); }
  // The request no longer wants its KV; its blocks stay pinned until the release.
  void cancel_import(const std::string& request_id) { connector_->cancel_import(request_id); }
  // A resumed stream that was to import its KV found it all cached here.
  void count_served_from_cache() { ++remote_prefills_served_from_cache_total_; }

  // Prefill side. Pins the blocks of `seq_id` and starts exporting its prompt's KV (before the
  // forward of the step that completes the prompt); on error nothing stays pinned.
  Status start_export(const std::string& request_id, const KvExportTarget& target, SeqId seq_id,
                      std::span<const int32_t> block_table, int num_prompt_tokens);
  // The forward's listener: tells the connector each layer written; empty when this step
  // started no export.
  LayerKvWritten layer_listener();
  // After sampling: this step's exports whose sequence is still alive finish, the others
  // are aborted (the receiver must not use their KV).
  void finish_step_exports();
  // The step failed: its exports are aborted.
  void abort_step_exports();

  // Applies the connector's events since the last call, in order: releases unpin, a failed
  // import of a live request falls back to a local prefill (Scheduler::requeue_failed_import),
  // the import of a request that ended meanwhile completes into the prefix cache or ends;
  // first tokens and landed KV of live requests go to `requests`.
  void apply_events(ImportListener& requests);

  // Writes the transfer counters into `stats`.
  void fill_stats(ServiceStats& stats) const;

 private:
  void unpin(SeqId seq_id);
  void import_failed(const std::string& request_id, const std::optional<SeqId>& live,
                     const Status& status, const std::optional<RemotePrefillStats>& stats);
  // The sequence of an ended request (not live) whose KV is still coming.
  std::optional<SeqId> awaiting_after_finish(const std::string& request_id) const;

  KvConnector* connector_;
  Scheduler& scheduler_;
  // Blocks pinned for a transfer, by request id; they outlive the request itself.
  std::unordered_map<std::string, SeqId> exports_;
  std::unordered_map<std::string, SeqId> imports_;
  // The exports started by the current step.
  std::vector<std::pair<std::string, SeqId>> step_exports_;
  int64_t kv_checksum_mismatches_total_ = 0;
  int64_t remote_prefill_fallbacks_total_ = 0;
  int64_t remote_prefills_served_from_cache_total_ = 0;
  int64_t kv_refetches_total_ = 0;
  int64_t kv_import_hold_expired_total_ = 0;
};

}  // namespace pdserve
