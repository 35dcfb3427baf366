// What changed in a prefix cache since the changes were last taken, for the node's heartbeats
// (cache-aware routing in the proxy): the net change of each chained block key, stored or
// removed (the latest wins), or, after `reset`, a snapshot of every key registered. Bounded:
// past `capacity` keys the journal drops what it holds and asks its owner for a snapshot
// (needs_snapshot), which the owner takes where it may read the cache (the engine thread).
// Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace pdserve {

// The journals' bound: the most keys one heartbeat reports (kMaxPrefixReportHashes).
inline constexpr size_t kPrefixJournalCapacity = 8192;

struct PrefixCacheChanges {
  bool reset = false;  // forget the earlier state: `stored` is every key (a snapshot)
  std::vector<uint64_t> stored;
  std::vector<uint64_t> removed;  // empty with reset

  bool empty() const { return !reset && stored.empty() && removed.empty(); }
};

class PrefixCacheJournal {
 public:
  explicit PrefixCacheJournal(size_t capacity) : capacity_(capacity) {}

  void record_stored(uint64_t key) { record(key, Change::kStored); }
  void record_removed(uint64_t key) { record(key, Change::kRemoved); }
  // Applies changes made after the ones recorded here.
  void merge_newer(const PrefixCacheChanges& newer);
  // Puts back changes taken earlier (e.g. their heartbeat failed) under the ones recorded since.
  void restore_older(const PrefixCacheChanges& older);

  // The owner must call set_snapshot before the next take.
  bool needs_snapshot() const { return needs_snapshot_; }
  void request_snapshot();
  // Every key registered now (the first `capacity` of them are kept).
  void set_snapshot(const std::vector<uint64_t>& registered);

  // The changes, emptying the journal; nothing while a snapshot is due.
  PrefixCacheChanges take();

 private:
  enum class Change { kStored, kRemoved };

  void record(uint64_t key, Change change);

  size_t capacity_;
  bool reset_ = false;
  bool needs_snapshot_ = false;
  std::unordered_map<uint64_t, Change> changes_;
};

}  // namespace pdserve
