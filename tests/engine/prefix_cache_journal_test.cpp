// PrefixCacheJournal: the net change of each key between two takes, changes given back under
// newer ones, and its bound (a snapshot instead of unbounded changes).
#include "common/engine/prefix_cache_journal.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace pdserve {
namespace {

std::vector<uint64_t> sorted(std::vector<uint64_t> keys) {
  std::ranges::sort(keys);
  return keys;
}

TEST(PrefixCacheJournalTest, TheLatestChangeOfAKeyWinsAndTakeEmptiesTheJournal) {
  PrefixCacheJournal journal(16);
  journal.record_stored(1);
  journal.record_stored(2);
  journal.record_removed(2);
  journal.record_removed(3);
  journal.record_stored(3);
  PrefixCacheChanges changes = journal.take();
  EXPECT_FALSE(changes.reset);
  EXPECT_EQ(sorted(changes.stored), (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(changes.removed, (std::vector<uint64_t>{2}));
  EXPECT_TRUE(journal.take().empty());
}

TEST(PrefixCacheJournalTest, RestoredChangesLieUnderNewerOnes) {
  PrefixCacheJournal journal(16);
  journal.record_stored(1);
  journal.record_stored(2);
  const PrefixCacheChanges lost = journal.take();  // its heartbeat failed
  journal.record_removed(1);
  journal.record_stored(5);
  journal.restore_older(lost);
  const PrefixCacheChanges changes = journal.take();
  EXPECT_EQ(sorted(changes.stored), (std::vector<uint64_t>{2, 5}));
  EXPECT_EQ(changes.removed, (std::vector<uint64_t>{1}));
}

TEST(PrefixCacheJournalTest, ARestoredSnapshotStaysASnapshotWithoutRemovals) {
  PrefixCacheJournal journal(16);
  journal.request_snapshot();
  EXPECT_TRUE(journal.take().empty());  // nothing until the owner gives the snapshot
  journal.set_snapshot({1, 2});
  const PrefixCacheChanges snapshot = journal.take();
  ASSERT_TRUE(snapshot.reset);
  journal.record_removed(2);
  journal.record_stored(7);
  journal.restore_older(snapshot);
  const PrefixCacheChanges changes = journal.take();
  EXPECT_TRUE(changes.reset);
  EXPECT_EQ(sorted(changes.stored), (std::vector<uint64_t>{1, 7}));
  EXPECT_TRUE(changes.removed.empty());
}

TEST(PrefixCacheJournalTest, OverflowAsksForASnapshotWhichIsBoundedToo) {
  PrefixCacheJournal journal(4);
  for (uint64_t key = 0; key < 5; ++key) journal.record_stored(key);
  EXPECT_TRUE(journal.needs_snapshot());
  EXPECT_TRUE(journal.take().empty());
  journal.record_stored(99);  // covered by the snapshot to come
  journal.set_snapshot({10, 11, 12, 13, 14, 15});
  EXPECT_FALSE(journal.needs_snapshot());
  const PrefixCacheChanges changes = journal.take();
  EXPECT_TRUE(changes.reset);
  EXPECT_EQ(changes.stored.size(), 4u);
  EXPECT_TRUE(changes.removed.empty());
}

TEST(PrefixCacheJournalTest, MergingNewerChangesKeepsTheirMeaning) {
  PrefixCacheJournal shared(16);
  shared.record_stored(1);
  shared.merge_newer({false, {2}, {1}});
  PrefixCacheChanges changes = shared.take();
  EXPECT_EQ(changes.stored, (std::vector<uint64_t>{2}));
  EXPECT_EQ(changes.removed, (std::vector<uint64_t>{1}));
  shared.record_stored(3);
  shared.merge_newer({true, {4}, {}});  // a snapshot replaces what came before
  shared.record_removed(4);
  changes = shared.take();
  EXPECT_TRUE(changes.reset);
  EXPECT_TRUE(changes.stored.empty());
  EXPECT_TRUE(changes.removed.empty());
}

}  // namespace
}  // namespace pdserve
