// The tier store's key journal as a heartbeat feed (serving/prefix_cache_feeds.h, issue #32):
// nothing until a key moves, then its changes labelled with the engine's block size; a resync
// passed to the store gives a snapshot, changes of a lost heartbeat go back to the store under
// newer ones, and through a PrefixCacheFanout each proxy gets every change. Against a fake
// store; the real store's journal (bound, snapshot order) is tests/kv_tiers/tier_store_test.
#include "serving/prefix_cache_feeds.h"

#include <algorithm>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

#include "serving/prefix_cache_fanout.h"
#include "tests/serving/fake_tiered_key_source.h"

namespace pdserve {
namespace {

using testing::FakeTieredKeySource;

constexpr int kBlockSize = 16;

std::vector<uint64_t> sorted(std::vector<uint64_t> keys) {
  std::sort(keys.begin(), keys.end());
  return keys;
}

TEST(TieredCacheFeed, NothingUntilAKeyMovesThenItsChanges) {
  FakeTieredKeySource source;
  PrefixCacheFeed feed = tiered_cache_feed(&source, kBlockSize);
  EXPECT_FALSE(feed.take().has_value());
  source.offload(7);
  source.offload(8);
  source.drop(7);
  const std::optional<PrefixCacheReport> report = feed.take();
  ASSERT_TRUE(report);
  EXPECT_EQ(report->block_size, kBlockSize);
  EXPECT_FALSE(report->reset);
  EXPECT_EQ(report->stored, std::vector<uint64_t>{8});
  EXPECT_EQ(report->removed, std::vector<uint64_t>{7});
  EXPECT_FALSE(feed.take().has_value());
}

TEST(TieredCacheFeed, AResyncSendsTheMostRecentKeysCutAtTheReportBound) {
  FakeTieredKeySource source;
  PrefixCacheFeed feed = tiered_cache_feed(&source, kBlockSize);
  const uint64_t total = kMaxPrefixReportHashes + 100;
  for (uint64_t key = 1; key <= total; ++key) source.offload(key);  // key `total` most recent
  (void)feed.take();
  feed.resync();  // a proxy registered the node
  const std::optional<PrefixCacheReport> snapshot = feed.take();
  ASSERT_TRUE(snapshot);
  EXPECT_TRUE(snapshot->reset);
  EXPECT_TRUE(snapshot->removed.empty());
  std::vector<uint64_t> expected;
  for (uint64_t key = 101; key <= total; ++key) expected.push_back(key);
  EXPECT_EQ(sorted(snapshot->stored), expected);  // the 100 least recent left out
  // The changes that happened before the snapshot are in it, not sent again.
  EXPECT_FALSE(feed.take().has_value());
  source.drop(total);
  EXPECT_EQ(feed.take()->removed, std::vector<uint64_t>{total});
}

TEST(TieredCacheFeed, ChangesOfALostHeartbeatComeBackUnderNewerOnes) {
  FakeTieredKeySource source;
  PrefixCacheFeed feed = tiered_cache_feed(&source, kBlockSize);
  source.offload(1);
  source.offload(2);
  PrefixCacheReport lost = feed.take().value();
  source.drop(2);  // newer than the lost report: wins over its "stored"
  feed.restore(std::move(lost));
  const PrefixCacheReport again = feed.take().value();
  EXPECT_EQ(again.stored, std::vector<uint64_t>{1});
  EXPECT_EQ(again.removed, std::vector<uint64_t>{2});
}

TEST(TieredCacheFeed, EachProxyOfAFanOutGetsEveryChange) {
  FakeTieredKeySource source;
  PrefixCacheFanout fanout(tiered_cache_feed(&source, kBlockSize), kBlockSize, 2);
  PrefixCacheFeed first = fanout.feed(0);
  PrefixCacheFeed second = fanout.feed(1);
  source.offload(5);
  EXPECT_EQ(first.take()->stored, std::vector<uint64_t>{5});
  source.offload(6);
  EXPECT_EQ(sorted(second.take()->stored), (std::vector<uint64_t>{5, 6}));
  EXPECT_EQ(first.take()->stored, std::vector<uint64_t>{6});
  // The second proxy registers again: both get a snapshot of every key.
  second.resync();
  const PrefixCacheReport snapshot = second.take().value();
  EXPECT_TRUE(snapshot.reset);
  EXPECT_EQ(sorted(snapshot.stored), (std::vector<uint64_t>{5, 6}));
  EXPECT_TRUE(first.take()->reset);
}

}  // namespace
}  // namespace pdserve
