// TieredKeyFeed: a node's KV-tier keys reach its heartbeats bounded and resynced as the pool's
// do: a snapshot after registration (most recently used keys first, cut at the journal's
// bound), changes after it, changes of a lost heartbeat given back, a snapshot again after an
// overflow; and through a PrefixCacheFanout, each proxy gets them all.
#include "serving/tiered_key_feed.h"

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

TEST(TieredKeyFeed, NothingUntilAKeyMovesThenItsChanges) {
  FakeTieredKeySource source;
  TieredKeyFeed tiers(source, kBlockSize);
  PrefixCacheFeed feed = tiers.feed();
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

TEST(TieredKeyFeed, AResyncSendsTheMostRecentKeysCutAtTheReportBound) {
  FakeTieredKeySource source;
  TieredKeyFeed tiers(source, kBlockSize);
  PrefixCacheFeed feed = tiers.feed();
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

TEST(TieredKeyFeed, ChangesOfALostHeartbeatComeBackUnderNewerOnes) {
  FakeTieredKeySource source;
  TieredKeyFeed tiers(source, kBlockSize);
  PrefixCacheFeed feed = tiers.feed();
  source.offload(1);
  source.offload(2);
  PrefixCacheReport lost = feed.take().value();
  source.drop(2);  // newer than the lost report: wins over its "stored"
  feed.restore(std::move(lost));
  const PrefixCacheReport again = feed.take().value();
  EXPECT_EQ(again.stored, std::vector<uint64_t>{1});
  EXPECT_EQ(again.removed, std::vector<uint64_t>{2});
}

TEST(TieredKeyFeed, MoreChangesThanOneReportHoldsBecomeASnapshotOfTheMostRecentKeys) {
  FakeTieredKeySource source(4 * kMaxPrefixReportHashes);  // its own journal holds them all
  TieredKeyFeed tiers(source, kBlockSize);
  PrefixCacheFeed feed = tiers.feed();
  const uint64_t total = kMaxPrefixReportHashes + 1;
  for (uint64_t key = 1; key <= total; ++key) source.offload(key);
  const PrefixCacheReport report = feed.take().value();
  EXPECT_TRUE(report.reset);
  EXPECT_TRUE(report.removed.empty());
  ASSERT_EQ(report.stored.size(), kMaxPrefixReportHashes);
  EXPECT_EQ(std::count(report.stored.begin(), report.stored.end(), uint64_t{1}), 0);
  EXPECT_EQ(std::count(report.stored.begin(), report.stored.end(), total), 1);
  EXPECT_FALSE(feed.take().has_value());
}

TEST(TieredKeyFeed, EachProxyOfAFanOutGetsEveryChange) {
  FakeTieredKeySource source;
  TieredKeyFeed tiers(source, kBlockSize);
  PrefixCacheFanout fanout(tiers.feed(), kBlockSize, 2);
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
