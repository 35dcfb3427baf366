#include "common/engine/kv_transfer_coordinator.h"

#include <utility>

#include "common/core/log.h"

namespace pdserve {
namespace {

// What a resumed stream asks a prefill node for: the KV of its prompt and of its delivered
// tokens but the last (whose KV its next decode step writes). The engine keeps its own sampler
// and does not use the prefill node's token, so that token is sampled greedily.
InferenceRequest resumed_import(const InferenceRequest& request) {
  InferenceRequest work;
  work.id = request.id;
  work.prompt_tokens = request.prompt_tokens;
  const std::vector<int32_t>& delivered = request.resume->output_tokens;
  work.prompt_tokens.insert(work.prompt_tokens.end(), delivered.begin(), delivered.end() - 1);
  work.sampling.temperature = 0.0f;
  work.sampling.max_tokens = 1;
  work.kv_import = request.kv_import;
  return work;
}

}  // namespace

KvTransferCoordinator::KvTransferCoordinator(KvConnector* connector, Scheduler& scheduler)
    : connector_(connector), scheduler_(scheduler) {}

void KvTransferCoordinator::unpin(const SeqId seq_id) {
  const Status unpinned = scheduler_.block_manager().unpin(seq_id);
  PDS_CHECK(unpinned.ok(), unpinned.to_string());
}

Status KvTransferCoordinator::start_import(const InferenceRequest& request, SeqId seq_id) {
  const Sequence& seq = *scheduler_.find(seq_id);
  Status pinned = scheduler_.block_manager().pin(seq_id);
  PDS_CHECK(pinned.ok(), pinned.to_string());
  const std::vector<int32_t> table(scheduler_.block_manager().block_table(seq_id).begin(),
                                   scheduler_.block_manager().block_table(seq_id).end());
  const Status started = capture_status([&] {
    return connector_->start_import(request.resume ? resumed_import(request) : request, table,
                                    seq.num_computed_tokens());
  });
  if (!started.ok()) {
    unpin(seq_id);
    return started;
  }
  imports_.emplace(request.id, seq_id);
  return Status::ok_status();
}

Status KvTransferCoordinator::start_export(const std::string& request_id,
                                           const KvExportTarget& target, SeqId seq_id,
                                           std::span<const int32_t> block_table,
                                           int num_prompt_tokens) {
  Status pinned = scheduler_.block_manager().pin(seq_id);
  PDS_CHECK(pinned.ok(), pinned.to_string());
  const Status status = capture_status(
      [&] { return connector_->start_export(request_id, target, block_table, num_prompt_tokens); });
  if (!status.ok()) {
    unpin(seq_id);
    return status;
  }
  exports_.emplace(request_id, seq_id);
  step_exports_.emplace_back(request_id, seq_id);
  return Status::ok_status();
}

LayerKvWritten KvTransferCoordinator::layer_listener() {
  if (step_exports_.empty()) return {};
  return [this](int layer) { connector_->layer_written(layer); };
}

void KvTransferCoordinator::finish_step_exports() {
  for (const auto& [request_id, seq_id] : step_exports_) {
    const Sequence* seq = scheduler_.find(seq_id);
    if (seq != nullptr && seq->status() != SequenceStatus::kAborted) {
      connector_->finish_export(request_id);
    } else {
      connector_->abort_export(request_id);
    }
  }
  step_exports_.clear();
}

void KvTransferCoordinator::abort_step_exports() {
  for (const auto& [request_id, seq_id] : step_exports_) connector_->abort_export(request_id);
  step_exports_.clear();
}

void KvTransferCoordinator::apply_events(ImportListener& requests) {
  if (connector_ == nullptr) return;
  for (KvEvent& event : connector_->poll()) {
    switch (event.kind) {
      case KvEventKind::kExportReleased:
        if (auto it = exports_.find(event.request_id); it != exports_.end()) {
          unpin(it->second);
          exports_.erase(it);
        }
        break;
      case KvEventKind::kImportReleased:
        // Not OK: freed at the hold deadline, without a confirmation (the connector logged why).
        if (!event.status.ok()) ++kv_import_hold_expired_total_;
        if (auto it = imports_.find(event.request_id); it != imports_.end()) {
          unpin(it->second);
          imports_.erase(it);
        }
        break;
      case KvEventKind::kFirstToken:
        PDS_CHECK(event.result.has_value(), "a remote first token without its result");
        if (const std::optional<SeqId> live = requests.live_sequence(event.request_id)) {
          requests.import_first_token(event.request_id, *live, std::move(*event.result));
        }
        break;
      case KvEventKind::kImportReady: {
        PDS_CHECK(event.stats.has_value(), "an import is ready without its figures");
        kv_checksum_mismatches_total_ += event.stats->checksum_mismatches;
        kv_refetches_total_ += event.stats->refetches;
        if (const std::optional<SeqId> live = requests.live_sequence(event.request_id)) {
          requests.import_ready(event.request_id, *live, std::move(*event.stats));
        } else if (const std::optional<SeqId> seq_id = awaiting_after_finish(event.request_id)) {
          // Finished by its first token: its prompt still enters the prefix cache.
          const Status completed = scheduler_.complete_import(*seq_id);
          PDS_CHECK(completed.ok(), completed.to_string());
        }
        break;
      }
      case KvEventKind::kImportFailed:
        import_failed(event.request_id, requests.live_sequence(event.request_id), event.status,
                      event.stats);
        break;
    }
  }
}

std::optional<SeqId> KvTransferCoordinator::awaiting_after_finish(
    const std::string& request_id) const {
  auto it = imports_.find(request_id);
  if (it == imports_.end()) return std::nullopt;
  const Sequence* seq = scheduler_.find(it->second);
  if (seq == nullptr || seq->status() != SequenceStatus::kAwaitingKv) return std::nullopt;
  return it->second;
}

void KvTransferCoordinator::import_failed(const std::string& request_id,
                                          const std::optional<SeqId>& live, const Status& status,
                                          const std::optional<RemotePrefillStats>& stats) {
  if (stats) {
    kv_checksum_mismatches_total_ += stats->checksum_mismatches;
    kv_refetches_total_ += stats->refetches;
  } else if (status.code() == StatusCode::kDataLoss) {
    ++kv_checksum_mismatches_total_;
  }
  if (!live) {
    if (const std::optional<SeqId> seq_id = awaiting_after_finish(request_id)) {
      const Status aborted = scheduler_.abort(*seq_id);
      PDS_CHECK(aborted.ok(), aborted.to_string());
    }
    return;
  }
  // The held blocks stay with the import (its kImportReleased unpins the holder); the sequence
  // queues for a local prefill with new blocks.
  Result<SeqId> holder = scheduler_.requeue_failed_import(*live);
  PDS_CHECK(holder.ok(), holder.status().to_string());
  if (auto it = imports_.find(request_id); it != imports_.end()) it->second = *holder;
  ++remote_prefill_fallbacks_total_;
  PDS_LOG_WARN("request '" + request_id + "': " + status.message() + "; prefilling it here");
}

void KvTransferCoordinator::fill_stats(ServiceStats& stats) const {
  stats.kv_checksum_mismatches_total = kv_checksum_mismatches_total_;
  stats.remote_prefill_fallbacks_total = remote_prefill_fallbacks_total_;
  stats.remote_prefills_served_from_cache_total = remote_prefills_served_from_cache_total_;
  stats.kv_refetches_total = kv_refetches_total_;
  stats.kv_import_hold_expired_total = kv_import_hold_expired_total_;
}

}  // namespace pdserve
