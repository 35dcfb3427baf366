#include "common/engine/kv_tier_coordinator.h"

#include <algorithm>
#include <string>

#include "common/core/log.h"
#include "common/engine/block_hash.h"

namespace pdserve {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

KvTierCoordinator::KvTierCoordinator(KvTierStore* store, Scheduler& scheduler, KvTierPolicy policy)
    : store_(store),
      scheduler_(scheduler),
      policy_(policy),
      host_bytes_per_second_(policy.prior_host_bytes_per_second),
      disk_bytes_per_second_(policy.prior_disk_bytes_per_second) {
  if (store_ == nullptr) return;
  scheduler_.set_prefix_loader(this);
  scheduler_.block_manager().track_newly_cached(true);
}

void KvTierCoordinator::unpin(SeqId seq_id) {
  const Status unpinned = scheduler_.block_manager().unpin(seq_id);
  PDS_CHECK(unpinned.ok(), unpinned.to_string());
}

std::vector<FinishedReload> KvTierCoordinator::step_begin() {
  std::vector<FinishedReload> finished;
  if (store_ == nullptr) return finished;
  for (const TierJobResult& result : store_->poll()) {
    if (auto offload = offloads_.find(result.job); offload != offloads_.end()) {
      scheduler_.block_manager().free(offload->second);
      offloads_.erase(offload);
    } else {
      finish_load(result, finished);
    }
  }
  give_up_overdue(finished);
  start_offload();
  return finished;
}

void KvTierCoordinator::finish_load(const TierJobResult& result,
                                    std::vector<FinishedReload>& finished) {
  auto it = loads_.find(result.job);
  if (it == loads_.end()) return;
  const Load load = it->second;
  loads_.erase(it);
  if (result.status.ok() && result.seconds > 0) {
    // A job with disk blocks measures the disk tier (its reads dominate), else the host tier.
    double& bandwidth = result.disk_blocks > 0 ? disk_bytes_per_second_ : host_bytes_per_second_;
    const double measured = static_cast<double>(result.bytes) / result.seconds;
    bandwidth += policy_.ewma_weight * (measured - bandwidth);
  }
  const Sequence* seq = load.abandoned ? nullptr : scheduler_.find(load.seq_id);
  const SequenceStatus waiting_in =
      load.for_import ? SequenceStatus::kAwaitingKv : SequenceStatus::kLoadingKv;
  if (seq != nullptr && seq->status() == waiting_in) {
    const int tokens = result.status.ok() ? result.blocks * scheduler_.config().block_size : 0;
    const Status completed = load.for_import ? scheduler_.add_loaded_tokens(load.seq_id, tokens)
                                             : scheduler_.complete_load(load.seq_id, tokens);
    PDS_CHECK(completed.ok(), completed.to_string());
    if (result.status.ok()) {
      counts_.reloaded_tokens_total += tokens;
    } else {
      ++counts_.reloads_failed_total;
      PDS_LOG_WARN("KV tiers: a prefix reload failed (" + result.status.message() +
                   "); the request computes it");
    }
    finished.push_back({load.seq_id,
                        KvReloadTiming{load.start, Clock::now(), load.host_blocks, load.disk_blocks,
                                       tokens, result.status.ok()},
                        load.for_import, false});
  }
  unpin(load.pin_owner);
}

void KvTierCoordinator::give_up_overdue(std::vector<FinishedReload>& finished) {
  const auto now = Clock::now();
  for (auto& [job, load] : loads_) {
    if (load.abandoned || now < load.deadline) continue;
    const Sequence* seq = scheduler_.find(load.seq_id);
    const SequenceStatus waiting_in =
        load.for_import ? SequenceStatus::kAwaitingKv : SequenceStatus::kLoadingKv;
    if (seq == nullptr || seq->status() != waiting_in) continue;
    Result<SeqId> holder = load.for_import ? scheduler_.requeue_failed_import(load.seq_id)
                                           : scheduler_.abandon_load(load.seq_id);
    if (load.for_import) {
      finished.push_back(
          {load.seq_id,
           KvReloadTiming{load.start, now, load.host_blocks, load.disk_blocks, 0, false}, true,
           true});
    }
    PDS_CHECK(holder.ok(), holder.status().to_string());
    load.pin_owner = *holder;
    load.abandoned = true;
    no_reload_.insert(load.seq_id);
    ++counts_.reloads_failed_total;
    PDS_LOG_WARN("KV tiers: a prefix reload passed its deadline; the request computes it");
  }
}

void KvTierCoordinator::start_offload() {
  BlockManager& blocks = scheduler_.block_manager();
  const SeqId holder = next_holder_;
  Result<std::vector<CachedBlock>> held =
      blocks.hold_newly_cached(holder, policy_.max_offload_blocks_per_step,
                               [this](uint64_t key) { return !store_->holds(key); });
  PDS_CHECK(held.ok(), held.status().to_string());
  if (held->empty()) return;
  --next_holder_;
  std::vector<TierOffload> offloads;
  offloads.reserve(held->size());
  for (CachedBlock& block : *held) {
    offloads.push_back(
        {TieredBlockId{block.key, block.parent_key, std::move(block.tokens)}, block.block});
  }
  Result<TierJobId> job = store_->start_offload(offloads);
  if (!job.ok()) {
    blocks.free(holder);  // no room or no copy: the cache loses them, nothing else
    return;
  }
  offloads_.emplace(*job, holder);
}

void KvTierCoordinator::note_prefill(int tokens, double seconds) {
  if (store_ == nullptr || tokens <= 0 || seconds <= 0) return;
  const double measured = tokens / seconds;
  prefill_tokens_per_second_ =
      prefill_tokens_per_second_ == 0
          ? measured
          : prefill_tokens_per_second_ +
                policy_.ewma_weight * (measured - prefill_tokens_per_second_);
}

double KvTierCoordinator::estimated_reload_seconds(int host_blocks, int disk_blocks) const {
  const double block_bytes = static_cast<double>(store_->block_bytes());
  return host_blocks * block_bytes / host_bytes_per_second_ +
         disk_blocks * block_bytes / disk_bytes_per_second_;
}

bool KvTierCoordinator::reload_is_faster(int host_blocks, int disk_blocks) const {
  if (prefill_tokens_per_second_ == 0) return true;
  const double recompute_seconds =
      (host_blocks + disk_blocks) * scheduler_.config().block_size / prefill_tokens_per_second_;
  return estimated_reload_seconds(host_blocks, disk_blocks) < recompute_seconds;
}

bool KvTierCoordinator::start_load(const Sequence& seq, std::span<const int32_t> block_table) {
  return start(seq, block_table, false);
}

bool KvTierCoordinator::start_import_load(const Sequence& seq,
                                          std::span<const int32_t> block_table) {
  // A resumed stream's import carries its delivered tokens too: not reloaded.
  if (seq.num_output_tokens() > 0) return false;
  return start(seq, block_table, true);
}

bool KvTierCoordinator::start(const Sequence& seq, std::span<const int32_t> block_table,
                              bool for_import) {
  if (store_ == nullptr || seq.sampling_params().prompt_logprobs) return false;
  if (no_reload_.erase(seq.id()) > 0) return false;  // its reload was given up: compute it
  const int block_size = scheduler_.config().block_size;
  const int first = seq.num_computed_tokens() / block_size;
  // The block of the last token is always computed (its logits are needed).
  const int last = (seq.num_tokens() - 1) / block_size;
  if (first >= last) return false;
  const std::span<const int32_t> tokens = seq.tokens();
  uint64_t parent = kRootBlockHash;
  std::vector<TieredBlockId> ids;
  for (int index = 0; index < last; ++index) {
    const auto content =
        tokens.subspan(static_cast<size_t>(index * block_size), static_cast<size_t>(block_size));
    const uint64_t key = hash_block_tokens(parent, content);
    if (index >= first) ids.push_back({key, parent, {content.begin(), content.end()}});
    parent = key;
  }
  counts_.queried_tokens_total += static_cast<int64_t>(ids.size()) * block_size;
  const std::vector<KvTier> tiers = store_->match(ids);
  if (tiers.empty()) return false;
  const int disk_blocks = static_cast<int>(std::ranges::count(tiers, KvTier::kDisk));
  const int host_blocks = static_cast<int>(tiers.size()) - disk_blocks;
  if (policy_.reload == KvTierPolicy::Reload::kWhenFaster &&
      !reload_is_faster(host_blocks, disk_blocks)) {
    ++counts_.reloads_declined_total;
    return false;
  }
  std::vector<TierReload> reloads;
  for (size_t i = 0; i < tiers.size(); ++i) {
    reloads.push_back({ids[i].key, block_table[static_cast<size_t>(first) + i]});
  }
  Result<TierJobId> job = store_->start_reload(reloads);
  if (!job.ok()) {
    ++counts_.reloads_failed_total;
    return false;
  }
  const Status pinned = scheduler_.block_manager().pin(seq.id());
  PDS_CHECK(pinned.ok(), pinned.to_string());
  const auto now = Clock::now();
  const auto estimate = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
      policy_.deadline_factor * estimated_reload_seconds(host_blocks, disk_blocks)));
  loads_.emplace(*job, Load{seq.id(), seq.id(), false, for_import, now,
                            now + std::max<Clock::duration>(policy_.min_deadline, estimate),
                            host_blocks, disk_blocks});
  ++counts_.reloads_total;
  return true;
}

void KvTierCoordinator::fill_stats(ServiceStats& stats) const {
  if (store_ == nullptr) return;
  stats.kv_tiers = store_->stats();
  stats.kv_tiers.queried_tokens_total = counts_.queried_tokens_total;
  stats.kv_tiers.reloads_total = counts_.reloads_total;
  stats.kv_tiers.reloads_declined_total = counts_.reloads_declined_total;
  stats.kv_tiers.reloads_failed_total = counts_.reloads_failed_total;
  stats.kv_tiers.reloaded_tokens_total = counts_.reloaded_tokens_total;
}

}  // namespace pdserve
