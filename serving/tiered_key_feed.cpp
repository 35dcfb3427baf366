#include "serving/tiered_key_feed.h"

#include <utility>

namespace pdserve {

TieredKeyFeed::TieredKeyFeed(TieredKeySource& source, int block_size)
    : source_(source), block_size_(block_size) {}

PrefixCacheFeed TieredKeyFeed::feed() {
  PrefixCacheFeed feed;
  feed.take = [this] { return take(); };
  feed.restore = [this](PrefixCacheReport report) { restore(report); };
  feed.resync = [this] { resync(); };
  return feed;
}

std::optional<PrefixCacheReport> TieredKeyFeed::take() {
  std::lock_guard lock(mutex_);
  if (!journal_.needs_snapshot()) journal_.merge_newer(source_.take_tiered_changes());
  if (journal_.needs_snapshot()) {
    // The changes so far are in the snapshot: drop them first, so that a key moving while the
    // snapshot is read shows again in the next changes (applying a key twice is harmless).
    (void)source_.take_tiered_changes();
    journal_.set_snapshot(source_.tiered_keys());
  }
  PrefixCacheChanges changes = journal_.take();
  if (changes.empty()) return std::nullopt;
  return PrefixCacheReport{block_size_, changes.reset, std::move(changes.stored),
                           std::move(changes.removed)};
}

void TieredKeyFeed::restore(const PrefixCacheReport& report) {
  std::lock_guard lock(mutex_);
  journal_.restore_older({report.reset, report.stored, report.removed});
}

void TieredKeyFeed::resync() {
  std::lock_guard lock(mutex_);
  journal_.request_snapshot();
}

}  // namespace pdserve
