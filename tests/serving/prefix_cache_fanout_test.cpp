// PrefixCacheFanout: each proxy of a node gets every prefix-cache change once, whatever the
// others' heartbeats did; one proxy's failed heartbeat or snapshot request does not touch the
// others' streams (beyond the snapshot they then also get).
#include "serving/prefix_cache_fanout.h"

#include <algorithm>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

namespace pdserve {
namespace {

// The engine's feed as the fan-out sees it: queued reports, and the resyncs asked of it.
struct FakeSource {
  std::vector<PrefixCacheReport> queued;
  int resyncs = 0;

  PrefixCacheFeed feed() {
    PrefixCacheFeed feed;
    feed.take = [this]() -> std::optional<PrefixCacheReport> {
      if (queued.empty()) return std::nullopt;
      PrefixCacheReport next = queued.front();
      queued.erase(queued.begin());
      return next;
    };
    feed.restore = [](PrefixCacheReport) { FAIL() << "the fan-out gives changes back to its own journals"; };
    feed.resync = [this] { ++resyncs; };
    return feed;
  }
};

std::vector<uint64_t> sorted(std::vector<uint64_t> keys) {
  std::sort(keys.begin(), keys.end());
  return keys;
}

TEST(PrefixCacheFanout, EveryProxyGetsEveryChangeAndFailuresStayWithTheirProxy) {
  FakeSource source;
  PrefixCacheFanout fanout(source.feed(), 16, 2);
  PrefixCacheFeed a = fanout.feed(0);
  PrefixCacheFeed b = fanout.feed(1);
  source.queued.push_back({16, false, {1, 2}, {}});
  const std::optional<PrefixCacheReport> first_a = a.take();
  ASSERT_TRUE(first_a);
  EXPECT_EQ(sorted(first_a->stored), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(first_a->block_size, 16);
  source.queued.push_back({16, false, {3}, {1}});
  // B had not taken the first changes: it gets both, netted.
  const std::optional<PrefixCacheReport> first_b = b.take();
  ASSERT_TRUE(first_b);
  EXPECT_EQ(sorted(first_b->stored), (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(first_b->removed, std::vector<uint64_t>{1});
  // A's heartbeat failed: its changes come back to A only, under the newer ones.
  a.restore(*first_a);
  const std::optional<PrefixCacheReport> second_a = a.take();
  ASSERT_TRUE(second_a);
  EXPECT_EQ(sorted(second_a->stored), (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(second_a->removed, std::vector<uint64_t>{1});
  EXPECT_FALSE(b.take());
  EXPECT_EQ(source.resyncs, 0);
}

TEST(PrefixCacheFanout, AProxyThatAsksForASnapshotGetsTheSourcesNextOneAndSoDoTheOthers) {
  FakeSource source;
  PrefixCacheFanout fanout(source.feed(), 16, 2);
  PrefixCacheFeed a = fanout.feed(0);
  PrefixCacheFeed b = fanout.feed(1);
  source.queued.push_back({16, false, {5}, {}});
  b.resync();  // B has just registered the node
  EXPECT_EQ(source.resyncs, 1);
  EXPECT_FALSE(b.take());  // nothing until the snapshot comes
  const std::optional<PrefixCacheReport> a_changes = a.take();
  ASSERT_TRUE(a_changes);  // what came before the resync still reaches A
  EXPECT_EQ(a_changes->stored, std::vector<uint64_t>{5});
  source.queued.push_back({16, true, {5, 6}, {}});
  for (PrefixCacheFeed* feed : {&b, &a}) {
    const std::optional<PrefixCacheReport> snapshot = feed->take();
    ASSERT_TRUE(snapshot);
    EXPECT_TRUE(snapshot->reset);
    EXPECT_EQ(sorted(snapshot->stored), (std::vector<uint64_t>{5, 6}));
  }
  EXPECT_EQ(source.resyncs, 1);
}

TEST(PrefixCacheFanout, AJournalThatOverflowsWhileItsProxyIsAwayAsksTheSourceForOneSnapshot) {
  FakeSource source;
  PrefixCacheFanout fanout(source.feed(), 16, 2);
  PrefixCacheFeed a = fanout.feed(0);
  PrefixCacheFeed b = fanout.feed(1);
  PrefixCacheReport many{16, false, {}, {}};
  for (uint64_t key = 0; key <= kPrefixJournalCapacity; ++key) many.stored.push_back(key);
  source.queued.push_back(many);
  EXPECT_FALSE(a.take());  // over the bound: A waits for a snapshot
  EXPECT_FALSE(b.take());
  EXPECT_EQ(source.resyncs, 1);
  source.queued.push_back({16, true, {9}, {}});
  EXPECT_EQ(a.take().value().stored, std::vector<uint64_t>{9});
  EXPECT_EQ(b.take().value().stored, std::vector<uint64_t>{9});
}

}  // namespace
}  // namespace pdserve
