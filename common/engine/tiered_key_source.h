// The keys of the prefix-cache blocks a node holds in its lower KV tiers (host memory, disk),
// as the node's heartbeats report them to the proxy for cache-aware placement. The node's tier
// store (kv_tiers/) implements it; the serving node reads it on its heartbeat thread.
#pragma once

#include <cstdint>
#include <vector>

#include "common/engine/prefix_cache_journal.h"

namespace pdserve {

class TieredKeySource {
 public:
  virtual ~TieredKeySource() = default;
  // The keys that entered or left the lower tiers since the last call (a snapshot after the
  // journal overflowed), as BlockManager::take_prefix_cache_changes reports the pool's.
  // Thread-safe.
  virtual PrefixCacheChanges take_tiered_changes() = 0;
  // Every key held in a lower tier, most recently used first (what a bounded snapshot keeps
  // first). Thread-safe.
  virtual std::vector<uint64_t> tiered_keys() const = 0;
};

}  // namespace pdserve
