// A node's lower KV tiers (the tier store's TieredKeySource) as a prefix-cache feed for its
// heartbeats (Heartbeat::tiered_cache), bounded and resynced as the engine's pool journal is:
// the source's changes go through a PrefixCacheJournal of kPrefixJournalCapacity keys; when a
// snapshot is due (a proxy registered the node, refused a report, or the journal overflowed) the
// next take is the source's keys, most recently used first, cut at the same bound. The feed is
// the source of a PrefixCacheFanout, as the engine's is, so each proxy gets its own stream.
// Thread-safe.
#pragma once

#include <mutex>
#include <optional>

#include "common/cluster/node_agent.h"
#include "common/engine/prefix_cache_journal.h"
#include "common/engine/tiered_key_source.h"

namespace pdserve {

class TieredKeyFeed {
 public:
  // `source` must outlive the feed; `block_size` (the engine's) labels the reports.
  TieredKeyFeed(TieredKeySource& source, int block_size);

  // Its take, restore and resync; valid while this lives.
  PrefixCacheFeed feed();

 private:
  std::optional<PrefixCacheReport> take();
  void restore(const PrefixCacheReport& report);
  void resync();

  TieredKeySource& source_;
  int block_size_;
  std::mutex mutex_;
  PrefixCacheJournal journal_{kPrefixJournalCapacity};
};

}  // namespace pdserve
