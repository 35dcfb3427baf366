// A stand-in for a node's KV tier store in tests (the real one is kv_tiers/): keys enter
// (offload) and leave (drop) its tiers as a test says, and it reports them as the
// TieredKeySource contract asks: changes through a bounded journal (a snapshot after an
// overflow or a resync, the most recently used keys kept when cut), changes of a lost heartbeat
// given back. Counts its takes, so a test can wait for the heartbeat after the one it cares
// about (an agent takes once per heartbeat, after the answer to the one before).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <vector>

#include "common/engine/prefix_cache_journal.h"
#include "common/engine/tiered_key_source.h"

namespace pdserve::testing {

class FakeTieredKeySource : public TieredKeySource {
 public:
  FakeTieredKeySource() = default;

  void offload(uint64_t key) {
    std::lock_guard lock(mutex_);
    keys_.remove(key);
    keys_.push_front(key);
    journal_.record_stored(key);
  }
  void drop(uint64_t key) {
    std::lock_guard lock(mutex_);
    keys_.remove(key);
    journal_.record_removed(key);
  }

  PrefixCacheChanges take_tiered_changes() override {
    std::lock_guard lock(mutex_);
    if (journal_.needs_snapshot()) journal_.set_snapshot({keys_.begin(), keys_.end()});
    ++takes_;
    took_.notify_all();
    return journal_.take();
  }
  void restore_tiered_changes(const PrefixCacheChanges& older) override {
    std::lock_guard lock(mutex_);
    journal_.restore_older(older);
  }
  void resync_tiered_keys() override {
    std::lock_guard lock(mutex_);
    journal_.request_snapshot();
  }

  size_t takes() const {
    std::lock_guard lock(mutex_);
    return takes_;
  }
  // Waits (up to `timeout`) for a take after the first `seen`; false on the timeout.
  bool wait_for_take_after(size_t seen, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return took_.wait_for(lock, timeout, [&] { return takes_ > seen; });
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable took_;
  std::list<uint64_t> keys_;  // front: most recent
  PrefixCacheJournal journal_{kPrefixJournalCapacity};
  size_t takes_ = 0;
};

}  // namespace pdserve::testing
