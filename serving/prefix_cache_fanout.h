// One node's prefix-cache changes for several proxies: the engine's journal is read by one
// reader, so the fan-out takes its changes and keeps one journal per proxy
// (PrefixCacheJournal), each taken, given back and resynced on its own by that proxy's node
// agent. A proxy that asks for a snapshot (it has just registered the node, or its journal
// overflowed while it was unreachable) gets the engine's next snapshot; the others get it too,
// which is correct (a snapshot replaces what they knew) and rare. Thread-safe: each agent runs
// on its own thread.
#pragma once

#include <cstddef>
#include <mutex>
#include <optional>
#include <vector>

#include "common/cluster/node_agent.h"
#include "common/engine/prefix_cache_journal.h"

namespace pdserve {

class PrefixCacheFanout {
 public:
  // `source` is the engine's feed (its take, restore and resync); `block_size` labels reports.
  PrefixCacheFanout(PrefixCacheFeed source, int block_size, size_t consumers);

  // The feed of consumer `index` (< consumers); valid while the fan-out lives.
  PrefixCacheFeed feed(size_t index);

 private:
  std::optional<PrefixCacheReport> take(size_t index);
  void restore(size_t index, const PrefixCacheReport& report);
  void resync(size_t index);
  // Moves the source's changes into every journal (under mutex_).
  void pull();

  PrefixCacheFeed source_;
  int block_size_;
  std::mutex mutex_;
  std::vector<PrefixCacheJournal> journals_;
  bool snapshot_asked_ = false;  // a resync of the source whose snapshot has not come yet
};

}  // namespace pdserve
