#include "serving/prefix_cache_feeds.h"

#include <functional>
#include <optional>
#include <utility>

namespace pdserve {
namespace {

static_assert(kPrefixJournalCapacity == kMaxPrefixReportHashes,
              "a journal's changes must fit in one heartbeat");

PrefixCacheReport prefix_report(PrefixCacheChanges changes, int block_size) {
  return {block_size, changes.reset, std::move(changes.stored), std::move(changes.removed)};
}

// A journal of prefix-cache keys (the engine's pool, or the tier store's lower tiers) as the
// fan-out reads it.
struct JournalAccess {
  std::function<PrefixCacheChanges()> take;
  std::function<void(const PrefixCacheChanges&)> restore;
  std::function<void()> resync;
};

PrefixCacheFeed journal_feed(JournalAccess journal, int block_size) {
  PrefixCacheFeed feed;
  feed.take = [take = std::move(journal.take), block_size]() -> std::optional<PrefixCacheReport> {
    PrefixCacheChanges changes = take();
    if (changes.empty()) return std::nullopt;
    return prefix_report(std::move(changes), block_size);
  };
  feed.restore = [restore = std::move(journal.restore)](PrefixCacheReport report) {
    restore({report.reset, std::move(report.stored), std::move(report.removed)});
  };
  feed.resync = std::move(journal.resync);
  return feed;
}

}  // namespace

PrefixCacheFeed prefix_cache_feed(LlmEngine* engine, int block_size) {
  return journal_feed(
      {[engine] { return engine->take_prefix_cache_changes(); },
       [engine](const PrefixCacheChanges& older) { engine->restore_prefix_cache_changes(older); },
       [engine] { engine->resync_prefix_cache(); }},
      block_size);
}

PrefixCacheFeed tiered_cache_feed(TieredKeySource* tiers, int block_size) {
  return journal_feed(
      {[tiers] { return tiers->take_tiered_changes(); },
       [tiers](const PrefixCacheChanges& older) { tiers->restore_tiered_changes(older); },
       [tiers] { tiers->resync_tiered_keys(); }},
      block_size);
}

}  // namespace pdserve
