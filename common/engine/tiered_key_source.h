// The keys of the prefix-cache blocks a node holds in its lower KV tiers (host memory, disk),
// as the node's heartbeats report them to the proxy for cache-aware placement. The node's tier
// store (kv_tiers/) implements it; the serving node reads it on its heartbeat thread.
#pragma once

#include "common/engine/prefix_cache_journal.h"

namespace pdserve {

class TieredKeySource {
 public:
  virtual ~TieredKeySource() = default;
  // The keys that entered or left the lower tiers since the last call, through a journal bound
  // by kPrefixJournalCapacity, as LlmEngine::take_prefix_cache_changes reports the pool's: after
  // an overflow or a resync, a snapshot (`reset`) of the keys held, cut at that bound keeping the
  // most recently used. Thread-safe, as are the two below.
  virtual PrefixCacheChanges take_tiered_changes() = 0;
  // Puts back changes taken earlier whose heartbeat may not have arrived, under the newer ones.
  virtual void restore_tiered_changes(const PrefixCacheChanges& older) = 0;
  // The next take is a snapshot (a proxy registered the node or refused a report).
  virtual void resync_tiered_keys() = 0;
};

}  // namespace pdserve
