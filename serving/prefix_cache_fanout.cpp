#include "serving/prefix_cache_fanout.h"

#include <utility>

namespace pdserve {
namespace {

PrefixCacheChanges changes_of(const PrefixCacheReport& report) {
  return {report.reset, report.stored, report.removed};
}

}  // namespace

PrefixCacheFanout::PrefixCacheFanout(PrefixCacheFeed source, int block_size, size_t consumers)
    : source_(std::move(source)),
      block_size_(block_size),
      journals_(consumers, PrefixCacheJournal(kPrefixJournalCapacity)) {}

PrefixCacheFeed PrefixCacheFanout::feed(size_t index) {
  PrefixCacheFeed feed;
  feed.take = [this, index] { return take(index); };
  feed.restore = [this, index](PrefixCacheReport report) { restore(index, report); };
  feed.resync = [this, index] { resync(index); };
  return feed;
}

void PrefixCacheFanout::pull() {
  const std::optional<PrefixCacheReport> newer = source_.take();
  if (!newer) return;
  if (newer->reset) snapshot_asked_ = false;
  const PrefixCacheChanges changes = changes_of(*newer);
  for (PrefixCacheJournal& journal : journals_) journal.merge_newer(changes);
}

std::optional<PrefixCacheReport> PrefixCacheFanout::take(size_t index) {
  std::lock_guard lock(mutex_);
  pull();
  PrefixCacheJournal& journal = journals_.at(index);
  if (journal.needs_snapshot() && !snapshot_asked_) {
    // This proxy's journal overflowed (its heartbeats failed for long): the engine's next
    // snapshot replaces it.
    source_.resync();
    snapshot_asked_ = true;
  }
  PrefixCacheChanges changes = journal.take();
  if (changes.empty()) return std::nullopt;
  return PrefixCacheReport{block_size_, changes.reset, std::move(changes.stored),
                           std::move(changes.removed)};
}

void PrefixCacheFanout::restore(size_t index, const PrefixCacheReport& report) {
  std::lock_guard lock(mutex_);
  journals_.at(index).restore_older(changes_of(report));
}

void PrefixCacheFanout::resync(size_t index) {
  std::lock_guard lock(mutex_);
  pull();  // what the others have not taken yet reaches them before the source starts over
  journals_.at(index).request_snapshot();
  source_.resync();
  snapshot_asked_ = true;
}

}  // namespace pdserve
