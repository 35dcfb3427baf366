// The tier store against a host pool (HostPoolCopier): the bytes a reload puts back are the
// bytes offloaded (the oracle: the pool's own copy), a hit must match key, tokens and parent,
// LRU and capacity per tier, the heartbeats' journal of tier keys (resync, a lost heartbeat's
// changes), the disk tier across a reopen and its refusal for another layout, and every
// injected disk fault costing the cache only.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/engine/block_hash.h"
#include "kv_tiers/tier_store.h"
#include "kv_transfer/host_pool_copier.h"

namespace pdserve::kv_tiers {
namespace {

KvLayout tiny_layout() {
  KvLayout layout;
  layout.num_layers = 2;
  layout.num_blocks = 8;
  layout.block_size = 4;
  layout.num_kv_heads = 1;
  layout.head_dim = 4;
  layout.dtype = DType::kF32;
  return layout;
}

// Fails the calls it is told to, the way a failing disk does.
class FaultyFiles final : public TierFiles {
 public:
  std::atomic<int> fail_writes{0};  // next N writes: ENOSPC
  std::atomic<int> fail_reads{0};   // next N reads: EIO
  Status write(const std::filesystem::path& path,
               std::span<const std::span<const std::byte>> parts) override {
    if (fail_writes > 0) {
      --fail_writes;
      return resource_exhausted("writing " + path.string() + ": No space left on device");
    }
    return real.write(path, parts);
  }
  Result<std::size_t> read(const std::filesystem::path& path, std::uint64_t offset,
                           std::span<std::byte> out) override {
    if (fail_reads > 0) {
      --fail_reads;
      return data_loss("reading " + path.string() + ": Input/output error");
    }
    return real.read(path, offset, out);
  }
  Result<std::uint64_t> size(const std::filesystem::path& path) override { return real.size(path); }
  Status remove(const std::filesystem::path& path) override { return real.remove(path); }
  Result<std::vector<std::filesystem::path>> list(const std::filesystem::path& dir) override {
    return real.list(dir);
  }
  PosixTierFiles real;
};

class TierStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ = tiny_layout();
    pool_.resize(layout_.total_bytes());
    for (size_t i = 0; i < pool_.size(); ++i) pool_[i] = static_cast<std::byte>(i * 7 + 3);
    copier_ = std::make_shared<kv_transfer::HostPoolCopier>(pool_.data(), pool_.size());
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::ranges::replace(name, '/', '_');  // a parameterized test's name has one
    dir_ = std::filesystem::path(PDSERVE_BINARY_DIR) / "test-kv-tiers" /
           (name + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    files_ = std::make_shared<FaultyFiles>();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<TierStore> make_store(int host_blocks, int disk_blocks,
                                        std::string fingerprint = "model-a") {
    TierStoreOptions options;
    options.layout = layout_;
    options.copier = copier_;
    options.files = files_;
    options.host_capacity_bytes = static_cast<uint64_t>(host_blocks) * layout_.bytes_per_block();
    if (disk_blocks > 0) {
      options.disk_dir = dir_;
      options.disk_capacity_bytes =
          static_cast<uint64_t>(disk_blocks) *
          (block_file_head_bytes(layout_.block_size) + layout_.bytes_per_block());
    }
    options.fingerprint = std::move(fingerprint);
    Result<std::unique_ptr<TierStore>> store = TierStore::create(std::move(options));
    EXPECT_TRUE(store.ok()) << store.status().to_string();
    return store.ok() ? std::move(*store) : nullptr;
  }

  // The block of `tokens` (block_size of them, starting at `first`) under `parent`.
  static TieredBlockId block_id(uint64_t parent, int32_t first) {
    TieredBlockId id;
    id.parent_key = parent;
    id.tokens = {first, first + 1, first + 2, first + 3};
    id.key = hash_block_tokens(parent, id.tokens);
    return id;
  }

  // The bytes a sequence reads from pool block `block`, in the host tier's order.
  std::vector<std::byte> block_bytes(int32_t block) const {
    std::vector<std::byte> bytes;
    for (int layer = 0; layer < layout_.num_layers; ++layer) {
      for (bool value_half : {false, true}) {
        const std::byte* at = pool_.data() + layout_.offset(layer, block, value_half);
        bytes.insert(bytes.end(), at, at + layout_.layer_block_bytes());
      }
    }
    return bytes;
  }
  void clear_block(int32_t block) {
    for (int layer = 0; layer < layout_.num_layers; ++layer) {
      for (bool value_half : {false, true}) {
        std::fill_n(pool_.data() + layout_.offset(layer, block, value_half),
                    layout_.layer_block_bytes(), std::byte{0});
      }
    }
  }

  // Polls until `job` finishes (deadline 10 s), then lets the worker seal and spill. Other
  // jobs' results are kept for their own wait.
  TierJobResult wait(TierStore& store, TierJobId job) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      for (TierJobResult& result : store.poll()) finished_.push_back(std::move(result));
      for (auto it = finished_.begin(); it != finished_.end(); ++it) {
        if (it->job != job) continue;
        TierJobResult result = std::move(*it);
        finished_.erase(it);
        store.wait_idle_for_tests();
        return result;
      }
      std::this_thread::yield();
    }
    ADD_FAILURE() << "tier job " << job << " never finished";
    return {};
  }

  void offload(TierStore& store, const TieredBlockId& id, int32_t pool_block) {
    const TierOffload block{id, pool_block};
    Result<TierJobId> job = store.start_offload({&block, 1});
    ASSERT_TRUE(job.ok()) << job.status().to_string();
    const TierJobResult result = wait(store, *job);
    ASSERT_TRUE(result.status.ok()) << result.status.to_string();
    ASSERT_EQ(result.blocks, 1);
  }

  // Reloads `id` into pool block `into` (cleared first); the result.
  TierJobResult reload(TierStore& store, const TieredBlockId& id, int32_t into) {
    clear_block(into);
    const TierReload block{id.key, into};
    Result<TierJobId> job = store.start_reload({&block, 1});
    if (!job.ok()) return TierJobResult{0, job.status()};
    return wait(store, *job);
  }

  KvLayout layout_;
  std::vector<std::byte> pool_;
  std::shared_ptr<kv_transfer::HostPoolCopier> copier_;
  std::filesystem::path dir_;
  std::shared_ptr<FaultyFiles> files_;
  std::vector<TierJobResult> finished_;
};

TEST_F(TierStoreTest, AReloadPutsBackTheOffloadedBytes) {
  auto store = make_store(4, 0);
  const TieredBlockId a = block_id(kRootBlockHash, 10);
  offload(*store, a, 1);
  EXPECT_TRUE(store->holds(a.key));
  ASSERT_EQ(store->match({&a, 1}), std::vector<KvTier>{KvTier::kHost});
  const std::vector<std::byte> expected = block_bytes(1);
  const TierJobResult result = reload(*store, a, 5);
  ASSERT_TRUE(result.status.ok()) << result.status.to_string();
  EXPECT_EQ(result.host_blocks, 1);
  EXPECT_EQ(result.bytes, layout_.bytes_per_block());
  EXPECT_EQ(block_bytes(5), expected);
  const KvTierStats stats = store->stats();
  EXPECT_EQ(stats.host.blocks, 1);
  EXPECT_EQ(stats.host.hit_blocks_total, 1);
  EXPECT_EQ(stats.offloaded_blocks_total, 1);
  EXPECT_EQ(stats.reloaded_bytes_total, static_cast<int64_t>(layout_.bytes_per_block()));
}

TEST_F(TierStoreTest, AHitMustMatchTokensAndParentNotJustTheKey) {
  auto store = make_store(4, 0);
  const TieredBlockId a = block_id(kRootBlockHash, 10);
  offload(*store, a, 1);
  TieredBlockId other_tokens = a;
  other_tokens.tokens[2] = 99;  // same key (a forced collision), other content
  EXPECT_TRUE(store->match({&other_tokens, 1}).empty());
  TieredBlockId other_parent = a;
  other_parent.parent_key = 12345;
  EXPECT_TRUE(store->match({&other_parent, 1}).empty());
  // A chain stops at its first miss.
  const TieredBlockId b = block_id(a.key, 20);
  const TieredBlockId chain[] = {a, b};
  EXPECT_EQ(store->match(chain).size(), 1u);
}

TEST_F(TierStoreTest, TheHostTierEvictsItsLeastRecentlyUsedBlockForGoodWithoutADisk) {
  auto store = make_store(2, 0);
  const TieredBlockId a = block_id(kRootBlockHash, 10);
  const TieredBlockId b = block_id(kRootBlockHash, 20);
  const TieredBlockId c = block_id(kRootBlockHash, 30);
  offload(*store, a, 1);
  offload(*store, b, 2);
  ASSERT_TRUE(reload(*store, a, 6).status.ok());  // a is now the most recently used
  (void)store->take_tiered_changes();
  offload(*store, c, 3);
  EXPECT_TRUE(store->holds(a.key));
  EXPECT_FALSE(store->holds(b.key));
  EXPECT_TRUE(store->holds(c.key));
  const PrefixCacheChanges changes = store->take_tiered_changes();
  EXPECT_EQ(changes.removed, std::vector<uint64_t>{b.key});
  EXPECT_EQ(changes.stored, std::vector<uint64_t>{c.key});
  EXPECT_EQ(store->tiered_keys(), (std::vector<uint64_t>{c.key, a.key}));
}

// The heartbeats' journal of tier keys is the store's own (TieredKeySource): a resync makes the
// next take a snapshot of every key held; changes whose heartbeat was lost go back
// under the newer ones (a newer eviction of the same key wins). Its bound and overflow (the most
// recently used keys kept) are PrefixCacheJournal's (tests/engine/prefix_cache_journal_test).
TEST_F(TierStoreTest, ItsKeyJournalResyncsAndTakesBackTheChangesOfALostHeartbeat) {
  auto store = make_store(3, 0);
  const TieredBlockId a = block_id(kRootBlockHash, 10);
  const TieredBlockId b = block_id(kRootBlockHash, 20);
  const TieredBlockId c = block_id(kRootBlockHash, 30);
  const TieredBlockId d = block_id(kRootBlockHash, 40);
  offload(*store, a, 1);
  offload(*store, b, 2);
  EXPECT_EQ(store->take_tiered_changes().stored.size(), 2u);
  EXPECT_TRUE(store->take_tiered_changes().empty());
  store->resync_tiered_keys();  // a proxy registered the node
  PrefixCacheChanges snapshot = store->take_tiered_changes();
  EXPECT_TRUE(snapshot.reset);
  std::ranges::sort(snapshot.stored);
  std::vector<uint64_t> held = {a.key, b.key};
  std::ranges::sort(held);
  EXPECT_EQ(snapshot.stored, held);
  EXPECT_TRUE(store->take_tiered_changes().empty());

  offload(*store, c, 3);
  const PrefixCacheChanges lost = store->take_tiered_changes();  // its heartbeat fails
  EXPECT_EQ(lost.stored, std::vector<uint64_t>{c.key});
  offload(*store, d, 4);  // the host tier is full: a, the least recently used, leaves
  store->restore_tiered_changes(lost);
  PrefixCacheChanges again = store->take_tiered_changes();
  std::ranges::sort(again.stored);
  std::vector<uint64_t> expected = {c.key, d.key};
  std::ranges::sort(expected);
  EXPECT_FALSE(again.reset);
  EXPECT_EQ(again.stored, expected);
  EXPECT_EQ(again.removed, std::vector<uint64_t>{a.key});

  // A lost "stored" under a newer removal of the same key: the removal wins.
  const PrefixCacheChanges stale{false, {b.key}, {}};
  offload(*store, a, 1);  // b is now the least recently used and leaves
  store->restore_tiered_changes(stale);
  const PrefixCacheChanges newest = store->take_tiered_changes();
  EXPECT_EQ(newest.stored, std::vector<uint64_t>{a.key});
  EXPECT_EQ(newest.removed, std::vector<uint64_t>{b.key});
}

TEST_F(TierStoreTest, AFullHostTierTakesAWholeNewBatchByEvictingTheOldOne) {
  auto store = make_store(4, 0);
  std::vector<TierOffload> first;
  std::vector<TierOffload> second;
  for (int i = 0; i < 4; ++i) {
    first.push_back({block_id(kRootBlockHash, 10 * (i + 1)), i});
    second.push_back({block_id(kRootBlockHash, 100 * (i + 1)), i});
  }
  for (const auto* batch : {&first, &second}) {
    Result<TierJobId> job = store->start_offload(*batch);
    ASSERT_TRUE(job.ok()) << job.status().to_string();
    ASSERT_EQ(wait(*store, *job).blocks, 4);
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_FALSE(store->holds(first[static_cast<size_t>(i)].id.key)) << i;
    EXPECT_EQ(store->match({&second[static_cast<size_t>(i)].id, 1}),
              std::vector<KvTier>{KvTier::kHost})
        << i;
  }
}

TEST_F(TierStoreTest, TheHostTierSpillsToDiskAndADiskHitReloadsTheSameBytes) {
  auto store = make_store(2, 8);
  const TieredBlockId a = block_id(kRootBlockHash, 10);
  const TieredBlockId b = block_id(kRootBlockHash, 20);
  offload(*store, a, 1);
  offload(*store, b, 2);  // leaves no slot free: a spills
  ASSERT_EQ(store->match({&a, 1}), std::vector<KvTier>{KvTier::kDisk});
  ASSERT_EQ(store->match({&b, 1}), std::vector<KvTier>{KvTier::kHost});
  const std::vector<std::byte> expected = block_bytes(1);
  const TierJobResult result = reload(*store, a, 7);
  ASSERT_TRUE(result.status.ok()) << result.status.to_string();
  EXPECT_EQ(result.disk_blocks, 1);
  EXPECT_EQ(block_bytes(7), expected);
  EXPECT_EQ(store->stats().disk.hit_blocks_total, 1);
}

TEST_F(TierStoreTest, TheDiskTierKeepsItsCapacityByEvictingItsOldestFile) {
  auto store = make_store(2, 2);
  std::vector<TieredBlockId> ids;
  for (int i = 0; i < 5; ++i) {
    ids.push_back(block_id(kRootBlockHash, 10 * (i + 1)));
    offload(*store, ids.back(), i);
  }
  // Host: the last one (one slot kept free); disk: the two before it.
  EXPECT_FALSE(store->holds(ids[0].key));
  EXPECT_FALSE(store->holds(ids[1].key));
  EXPECT_EQ(store->match({&ids[2], 1}), std::vector<KvTier>{KvTier::kDisk});
  EXPECT_EQ(store->match({&ids[3], 1}), std::vector<KvTier>{KvTier::kDisk});
  EXPECT_EQ(store->match({&ids[4], 1}), std::vector<KvTier>{KvTier::kHost});
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_ / "blocks"), {}), 2);
  EXPECT_EQ(store->stats().disk.blocks, 2);
}

// a is spilled to disk while the store runs; b, still in host memory at shutdown, is written
// out then: both reload their bytes after the reopen.
TEST_F(TierStoreTest, TheDiskTierSurvivesAReopenForTheSameModelAndIsClearedForAnother) {
  const TieredBlockId a = block_id(kRootBlockHash, 10);
  const TieredBlockId b = block_id(kRootBlockHash, 20);
  const std::vector<std::byte> expected_a = block_bytes(1);
  const std::vector<std::byte> expected_b = block_bytes(2);
  {
    auto store = make_store(2, 8);
    offload(*store, a, 1);
    offload(*store, b, 2);
    ASSERT_EQ(store->match({&b, 1}), std::vector<KvTier>{KvTier::kHost});
    ASSERT_EQ(store->stats().disk.blocks, 1);
  }
  {
    auto store = make_store(2, 8);
    ASSERT_EQ(store->match({&a, 1}), std::vector<KvTier>{KvTier::kDisk});
    ASSERT_EQ(store->match({&b, 1}), std::vector<KvTier>{KvTier::kDisk});
    TierJobResult result = reload(*store, a, 6);
    ASSERT_TRUE(result.status.ok()) << result.status.to_string();
    EXPECT_EQ(block_bytes(6), expected_a);
    result = reload(*store, b, 6);
    ASSERT_TRUE(result.status.ok()) << result.status.to_string();
    EXPECT_EQ(block_bytes(6), expected_b);
    PrefixCacheChanges changes = store->take_tiered_changes();
    std::ranges::sort(changes.stored);
    std::vector<uint64_t> both = {a.key, b.key};
    std::ranges::sort(both);
    EXPECT_EQ(changes.stored, both);  // reported to the proxy again
  }
  auto store = make_store(2, 8, "model-b");
  EXPECT_TRUE(store->match({&a, 1}).empty());
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_ / "blocks"), {}), 0);
}

TEST_F(TierStoreTest, AMissingDiskFolderIsRefused) {
  TierStoreOptions options;
  options.layout = layout_;
  options.copier = copier_;
  options.host_capacity_bytes = layout_.bytes_per_block();
  options.disk_dir = dir_ / "missing";
  options.disk_capacity_bytes = 1 << 20;
  const auto store = TierStore::create(std::move(options));
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(TierStoreTest, AFullDiskDropsTheBlockAndCountsIt) {
  auto store = make_store(2, 8);
  const TieredBlockId a = block_id(kRootBlockHash, 10);
  const TieredBlockId b = block_id(kRootBlockHash, 20);
  files_->fail_writes = 1;
  offload(*store, a, 1);
  offload(*store, b, 2);  // a's spill hits ENOSPC
  EXPECT_FALSE(store->holds(a.key));
  EXPECT_EQ(store->stats().disk_write_errors_total, 1);
  EXPECT_TRUE(store->holds(b.key));
  EXPECT_EQ(store->take_tiered_changes().stored, std::vector<uint64_t>{b.key});
}

TEST_F(TierStoreTest, AFailingReadFailsTheReloadAndKeepsTheStoreWorking) {
  auto store = make_store(2, 8);
  const TieredBlockId a = block_id(kRootBlockHash, 10);
  const TieredBlockId b = block_id(kRootBlockHash, 20);
  offload(*store, a, 1);
  offload(*store, b, 2);
  files_->fail_reads = 1;
  const TierJobResult failed = reload(*store, a, 6);
  EXPECT_FALSE(failed.status.ok());
  EXPECT_EQ(store->stats().disk_read_errors_total, 1);
  EXPECT_FALSE(store->holds(a.key));  // dropped: the next request recomputes it
  EXPECT_TRUE(reload(*store, b, 6).status.ok());
}

// Each damage to a's file fails its reload and removes it.
class DamagedFileTest : public TierStoreTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(DamagedFileTest, FailsTheReloadAndDropsTheFile) {
  auto store = make_store(2, 8);
  const TieredBlockId a = block_id(kRootBlockHash, 10);
  const TieredBlockId b = block_id(kRootBlockHash, 20);
  offload(*store, a, 1);
  offload(*store, b, 2);
  std::filesystem::path file;
  for (const auto& entry : std::filesystem::directory_iterator(dir_ / "blocks"))
    file = entry.path();
  ASSERT_FALSE(file.empty());
  const auto size = std::filesystem::file_size(file);
  if (GetParam() == "truncated") {
    std::filesystem::resize_file(file, size - 10);
  } else {
    std::fstream stream(file, std::ios::in | std::ios::out | std::ios::binary);
    stream.seekp(static_cast<std::streamoff>(GetParam() == "payload" ? size - 5 : 40));
    stream.put('\x5a');
  }
  const TierJobResult failed = reload(*store, a, 6);
  EXPECT_FALSE(failed.status.ok());
  EXPECT_EQ(failed.status.code(), StatusCode::kDataLoss);
  const KvTierStats stats = store->stats();
  EXPECT_EQ(stats.disk_read_errors_total + stats.checksum_mismatches_total, 1);
  EXPECT_FALSE(store->holds(a.key));
  EXPECT_FALSE(std::filesystem::exists(file));
}

INSTANTIATE_TEST_SUITE_P(Damage, DamagedFileTest,
                         ::testing::Values("truncated", "payload", "header"));

TEST_F(TierStoreTest, APinnedBlockIsNotEvictedWhileItsReloadRuns) {
  auto store = make_store(2, 0);
  const TieredBlockId a = block_id(kRootBlockHash, 10);
  const TieredBlockId b = block_id(kRootBlockHash, 20);
  const TieredBlockId c = block_id(kRootBlockHash, 30);
  offload(*store, a, 1);
  offload(*store, b, 2);
  const std::vector<std::byte> expected = block_bytes(1);
  clear_block(6);
  copier_->set_paused(true);  // a's reload stays in flight
  const TierReload block{a.key, 6};
  Result<TierJobId> job = store->start_reload({&block, 1});
  ASSERT_TRUE(job.ok());
  // a is the least recently used no more (touched) and pinned: c's offload evicts b.
  const TierOffload more{c, 3};
  Result<TierJobId> offloaded = store->start_offload({&more, 1});
  ASSERT_TRUE(offloaded.ok());
  EXPECT_TRUE(store->holds(a.key));
  EXPECT_FALSE(store->holds(b.key));
  // A reload of b, matched before the eviction, finds it gone.
  const TierReload gone{b.key, 7};
  EXPECT_EQ(store->start_reload({&gone, 1}).status().code(), StatusCode::kNotFound);
  copier_->set_paused(false);
  const TierJobResult result = wait(*store, *job);
  ASSERT_TRUE(result.status.ok());
  EXPECT_EQ(block_bytes(6), expected);
  ASSERT_TRUE(wait(*store, *offloaded).status.ok());
}

}  // namespace
}  // namespace pdserve::kv_tiers
