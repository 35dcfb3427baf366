// The engine's side of the lower KV tiers (kv_tier.h; issue #32), beside KvTransferCoordinator:
//  * offload: at the start of each step, the blocks that entered the pool's cached state since
//    the last step (and that the tiers do not hold yet) are held under a holder table
//    (BlockManager::hold_newly_cached) and copied to the host tier; the holder is freed when
//    the copy has been polled done, so a block is never reused while its offload reads it.
//    The held blocks stay prefix hits for new sequences (reading them is safe).
//  * reload: the scheduler's PrefixLoader. A sequence admitted with a prefix held in the tiers
//    beyond its pool hit gets its next blocks filled from the tiers: it is pinned and waits in
//    kLoadingKv; when the copy lands the blocks count as computed and enter the prefix cache;
//    when it fails the sequence computes them. Its deadline is max(min_deadline,
//    deadline_factor x the estimate); past it the sequence starts again with fresh blocks
//    (Scheduler::abandon_load: the old ones stay pinned until the copy ends) and is not
//    reloaded again. On a decode node the same reload runs before an import starts
//    (start_import_load): the sequence awaits KV meanwhile, the landed tokens count as cached
//    and only the rest is asked of the prefill node; a failed reload imports all the rest, an
//    overdue one falls back to a local prefill (Scheduler::requeue_failed_import).
//  * the rule (KvTierPolicy::kWhenFaster): reload when the estimated reload time, the hit's
//    bytes over each tier's measured bandwidth (EWMA of the reloads seen, priors before), is
//    below the estimated recompute time, the hit's tokens over the measured prefill rate (EWMA of
//    the prefill steps' tokens per second; none measured yet: reload).
// Used on the engine thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/engine/inference_service.h"
#include "common/engine/kv_tier.h"
#include "common/engine/scheduler.h"

namespace pdserve {

struct KvTierPolicy {
  enum class Reload { kWhenFaster, kAlways };  // kAlways: every hit (tests, benchmarks)
  Reload reload = Reload::kWhenFaster;
  std::chrono::milliseconds min_deadline{1000};
  double deadline_factor = 4.0;
  int max_offload_blocks_per_step = 256;
  // Bandwidths assumed before a reload from that tier was measured.
  double prior_host_bytes_per_second = 4e9;
  double prior_disk_bytes_per_second = 5e8;
  double ewma_weight = 0.2;  // of each new measurement
};

// A reload that ended, for the request's timeline. For an import (start_import_load) the
// engine then starts the import, unless the reload was given up (the sequence went back to
// the queue for a local prefill, Scheduler::requeue_failed_import).
struct FinishedReload {
  SeqId seq_id = 0;
  KvReloadTiming timing;
  bool for_import = false;
  bool given_up = false;
};

class KvTierCoordinator final : public PrefixLoader {
 public:
  // `store` null: a node without tiers (everything here is then a no-op). Both must outlive
  // the coordinator.
  KvTierCoordinator(KvTierStore* store, Scheduler& scheduler, KvTierPolicy policy = {});

  bool enabled() const { return store_ != nullptr; }
  // Copies still running (pool blocks held or pinned for them).
  bool busy() const { return !offloads_.empty() || !loads_.empty(); }

  // Start of each step: applies finished jobs (offload holds freed, loads completed or failed),
  // gives up overdue loads, and starts the offload of newly cached blocks. The loads that
  // ended for live sequences.
  std::vector<FinishedReload> step_begin();
  // A step's prefill: `tokens` computed in `seconds` (the measured prefill rate).
  void note_prefill(int tokens, double seconds);

  bool start_load(const Sequence& seq, std::span<const int32_t> block_table) override;
  // Decode side: before `seq` (awaiting KV, just given its blocks) asks a prefill node for its
  // prompt, the prefix the tiers hold beyond its pool hit is reloaded; true when a reload
  // started (the import waits for it: step_begin reports it, for_import).
  bool start_import_load(const Sequence& seq, std::span<const int32_t> block_table);

  // The rule: whether reloading `host_blocks` + `disk_blocks` is estimated faster than
  // recomputing their tokens.
  bool reload_is_faster(int host_blocks, int disk_blocks) const;

  void fill_stats(ServiceStats& stats) const;

 private:
  struct Load {
    SeqId seq_id = 0;
    SeqId pin_owner = 0;  // the sequence, or its holder once abandoned
    bool abandoned = false;
    bool for_import = false;
    std::chrono::steady_clock::time_point start;
    std::chrono::steady_clock::time_point deadline;
    int host_blocks = 0;
    int disk_blocks = 0;
  };

  double estimated_reload_seconds(int host_blocks, int disk_blocks) const;
  bool start(const Sequence& seq, std::span<const int32_t> block_table, bool for_import);
  void finish_load(const TierJobResult& result, std::vector<FinishedReload>& finished);
  void give_up_overdue(std::vector<FinishedReload>& finished);
  void start_offload();
  void unpin(SeqId seq_id);

  KvTierStore* store_;
  Scheduler& scheduler_;
  KvTierPolicy policy_;
  std::unordered_map<TierJobId, SeqId> offloads_;  // job -> holder of its blocks
  std::unordered_map<TierJobId, Load> loads_;
  std::unordered_set<SeqId> no_reload_;  // sequences whose reload was given up
  SeqId next_holder_ = -1;               // holder ids are negative: never a sequence's
  double host_bytes_per_second_;
  double disk_bytes_per_second_;
  double prefill_tokens_per_second_ = 0;  // 0: not measured yet
  KvTierStats counts_;
};

}  // namespace pdserve
