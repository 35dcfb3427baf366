// What the engine asks of a node's lower KV tiers (host memory, then disk; kv_tiers/ implements
// it): copies of prefix-cache blocks that outlive the device pool. The engine offloads blocks
// that enter the pool's cached state and reloads a tier hit into fresh pool blocks before the
// request's remaining prefill runs (kv_tier_coordinator.h). Every copy is asynchronous: a job
// is started, then polled. Used from the engine thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "common/core/status.h"
#include "common/engine/tiered_key_source.h"

namespace pdserve {

enum class KvTier { kHost, kDisk };
inline std::string_view kv_tier_name(KvTier tier) {
  return tier == KvTier::kHost ? "host" : "disk";
}

// A full prefix-cache block as the tiers store it: its chained key (block_hash.h) and what a
// hit must match exactly besides the key (its tokens and its parent's key), so a key collision
// never serves another prefix's KV.
struct TieredBlockId {
  uint64_t key = 0;
  uint64_t parent_key = 0;
  std::vector<int32_t> tokens;
};

struct TierOffload {
  TieredBlockId id;
  int32_t pool_block = 0;  // read until the job's result is polled
};

struct TierReload {
  uint64_t key = 0;
  int32_t pool_block = 0;  // written until the job's result is polled
};

using TierJobId = uint64_t;

struct KvTierUsage {
  int64_t blocks = 0;
  int64_t bytes = 0;
  int64_t capacity_bytes = 0;
  int64_t hit_blocks_total = 0;  // blocks reloaded from this tier
};

// The figures of /metrics (docs/METRICS.md): the store's, then the engine's decisions.
struct KvTierStats {
  bool enabled = false;
  KvTierUsage host;
  KvTierUsage disk;
  int64_t offloaded_blocks_total = 0;
  int64_t offloaded_bytes_total = 0;
  double offload_seconds_total = 0;
  int64_t offloads_skipped_total = 0;  // blocks that found no room in the host tier
  int64_t reloaded_blocks_total = 0;
  int64_t reloaded_bytes_total = 0;
  double reload_seconds_total = 0;
  int64_t disk_write_errors_total = 0;  // ENOSPC, EIO...: the block was dropped
  int64_t disk_read_errors_total = 0;   // unreadable or truncated files: the reload failed
  int64_t checksum_mismatches_total = 0;
  // The engine's: tokens looked up, reloads started, hits recomputed because the reload would
  // be slower, reloads that failed or passed their deadline (the request recomputed), tokens
  // reloaded.
  int64_t queried_tokens_total = 0;  // looked up in the tiers beyond the pool's hit
  int64_t reloads_total = 0;         // started (landed = started - failed, once ended)
  int64_t reloads_declined_total = 0;
  int64_t reloads_failed_total = 0;
  int64_t reloaded_tokens_total = 0;
};

// How a finished job went. A failed reload leaves its pool blocks' content undefined.
struct TierJobResult {
  TierJobId job = 0;
  Status status;
  int blocks = 0;  // offload: stored; reload: landed
  int host_blocks = 0;
  int disk_blocks = 0;
  uint64_t bytes = 0;
  double seconds = 0;  // from the start to the last copy's completion
};

// Also the TieredKeySource of the node's heartbeats (its methods are thread-safe; the others
// are called from the engine thread).
class KvTierStore : public TieredKeySource {
 public:
  virtual ~KvTierStore() = default;

  // The bytes of one block (all layers, K and V).
  virtual uint64_t block_bytes() const = 0;
  // Whether the tiers hold `key` or are storing it: an offload of it would add nothing.
  virtual bool holds(uint64_t key) const = 0;
  // Copies pool blocks into the host tier. A block that finds no room (every host slot busy)
  // is left out and counted; the job reports how many were stored. The pool blocks must not
  // change until the job's result has been polled. Error (nothing started) when no block can
  // be taken or the copy cannot start.
  virtual Result<TierJobId> start_offload(std::span<const TierOffload> blocks) = 0;
  // For the leading run of `blocks` (each the parent of the next) held with exactly this key,
  // parent key and tokens, the tier each is in now.
  virtual std::vector<KvTier> match(std::span<const TieredBlockId> blocks) = 0;
  // Copies held blocks into pool blocks (disk ones through host staging memory), verifying
  // each block's checksum first; all or nothing. The entries stay in their tiers, held until
  // the job ends. NotFound when an entry left the tiers since match().
  virtual Result<TierJobId> start_reload(std::span<const TierReload> blocks) = 0;
  // The jobs finished since the last call. Never blocks.
  virtual std::vector<TierJobResult> poll() = 0;
  // Whether a job is still running (its pool blocks may still be read or written).
  virtual bool busy() const = 0;
  // Called (from any thread; it must not block or call into the store) when a job may have
  // finished, so that an idle engine polls again. Set it before the first job.
  virtual void set_wakeup(std::function<void()> wakeup) = 0;
  // The store's figures (the engine's fields left zero). Thread-safe.
  virtual KvTierStats stats() const = 0;
};

}  // namespace pdserve
