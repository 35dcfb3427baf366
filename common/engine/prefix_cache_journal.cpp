#include "common/engine/prefix_cache_journal.h"

namespace pdserve {

void PrefixCacheJournal::record(uint64_t key, Change change) {
  if (needs_snapshot_) return;  // the snapshot will show it
  if (reset_ && change == Change::kRemoved) {
    changes_.erase(key);  // the proxy starts from the snapshot: nothing to remove there
    return;
  }
  changes_[key] = change;
  if (changes_.size() > capacity_) request_snapshot();
}

void PrefixCacheJournal::merge_newer(const PrefixCacheChanges& newer) {
  if (newer.reset) {
    changes_.clear();
    reset_ = true;
    needs_snapshot_ = false;
  }
  for (uint64_t key : newer.removed) record_removed(key);
  for (uint64_t key : newer.stored) record_stored(key);
}

void PrefixCacheJournal::restore_older(const PrefixCacheChanges& older) {
  if (needs_snapshot_ || reset_) return;  // what is here replaces the older changes anyway
  reset_ = older.reset;
  for (uint64_t key : older.removed) changes_.try_emplace(key, Change::kRemoved);
  for (uint64_t key : older.stored) changes_.try_emplace(key, Change::kStored);
  // Under an older snapshot a newer removal is just a key the snapshot no longer lists.
  if (reset_) std::erase_if(changes_, [](const auto& entry) { return entry.second == Change::kRemoved; });
  if (changes_.size() > capacity_) request_snapshot();
}

void PrefixCacheJournal::request_snapshot() {
  needs_snapshot_ = true;
  reset_ = false;
  changes_.clear();
}

void PrefixCacheJournal::set_snapshot(const std::vector<uint64_t>& registered) {
  needs_snapshot_ = false;
  reset_ = true;
  changes_.clear();
  for (uint64_t key : registered) {
    if (changes_.size() == capacity_) break;
    changes_.emplace(key, Change::kStored);
  }
}

PrefixCacheChanges PrefixCacheJournal::take() {
  PrefixCacheChanges changes;
  if (needs_snapshot_) return changes;
  changes.reset = reset_;
  for (const auto& [key, change] : changes_) {
    (change == Change::kStored ? changes.stored : changes.removed).push_back(key);
  }
  reset_ = false;
  changes_.clear();
  return changes;
}

}  // namespace pdserve
