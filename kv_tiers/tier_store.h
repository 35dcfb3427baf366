// A node's lower KV tiers (issue #32): the KvTierStore the engine offloads prefix-cache blocks
// to and reloads prefix hits from, and the TieredKeySource of the node's heartbeats.
//
// Content-addressed by the BlockManager's chained block keys; each entry also holds the
// block's tokens and parent key, which a hit must match exactly. A bounded host tier
// (host_tier.h; LRU, evicting to the disk tier when there is one, else for good; a block that
// finds every host slot busy goes straight to disk through staging memory) and a bounded
// disk tier (disk_tier.h; LRU, evicting for good; kept across restarts of the same model and KV
// layout). Copies between the pool and the host tier go through a kv_transfer::PoolCopier
// (Mooncake/NIXL style: the host memory is allocated once through it, batches are submitted
// and polled), so on CUDA they run on the copier's own stream and never block the engine.
// Checksums (XXH3-64, kv_transfer/kv_checksum.h) are taken when a block lands in the host tier
// and verified before any reload copies it back. Checksumming, disk writes (spills), reads and
// removals run on the store's worker thread, never on the engine thread.
//
// Every failure costs the cache only: a block that finds no room is not offloaded; a disk write
// that fails (ENOSPC, EIO) drops the block; a reload whose file is unreadable, truncated or
// corrupt, or whose checksum does not match, fails (the request recomputes) and drops the entry.
//
// A job's lifecycle (TierJob::Stage): an offload is kCopying (pool -> host) then done; a reload
// is kVerifying (worker: checksums, disk reads into staging memory), kReadyToCopy, kCopying
// (host -> pool), done; any stage may end kFailed.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common/core/kv_layout.h"
#include "common/engine/kv_tier.h"
#include "common/engine/prefix_cache_journal.h"
#include "kv_tiers/disk_tier.h"
#include "kv_tiers/host_tier.h"
#include "kv_tiers/tier_files.h"
#include "kv_transfer/pool_copier.h"

namespace pdserve::kv_tiers {

struct TierStoreOptions {
  uint64_t host_capacity_bytes = 0;  // at least one block
  std::filesystem::path disk_dir;    // empty: no disk tier
  uint64_t disk_capacity_bytes = 0;
  std::string fingerprint;  // what the disk tier's files are for (kv_tier_fingerprint)
  KvLayout layout;          // the pool's
  // The store's own (it sets the copier's on_finished).
  std::shared_ptr<kv_transfer::PoolCopier> copier;
  std::shared_ptr<TierFiles> files;  // null: the real file system
};

// The model folder's identity (config.json's bytes, the weight files' names, sizes and
// modification times) with the KV layout but the pool's size: what a disk tier's files may be
// reused for. Never fails: an unreadable file just takes part as unreadable.
std::string kv_tier_fingerprint(const std::filesystem::path& model_dir, const KvLayout& layout);

class TierStore final : public KvTierStore {
 public:
  // InvalidArgument for a host capacity under one block or a disk capacity under one block
  // file or a disk folder that is missing or not writable (the CLI's exit 2); ResourceExhausted
  // when the host memory cannot be allocated.
  static Result<std::unique_ptr<TierStore>> create(TierStoreOptions options);
  // Waits (bounded) for the copies still running into or out of its memory.
  ~TierStore() override;
  TierStore(const TierStore&) = delete;
  TierStore& operator=(const TierStore&) = delete;

  uint64_t block_bytes() const override { return layout_.bytes_per_block(); }
  bool holds(uint64_t key) const override;
  Result<TierJobId> start_offload(std::span<const TierOffload> blocks) override;
  std::vector<KvTier> match(std::span<const TieredBlockId> blocks) override;
  Result<TierJobId> start_reload(std::span<const TierReload> blocks) override;
  std::vector<TierJobResult> poll() override;
  bool busy() const override;
  void set_wakeup(std::function<void()> wakeup) override;
  KvTierStats stats() const override;

  PrefixCacheChanges take_tiered_changes() override;
  void restore_tiered_changes(const PrefixCacheChanges& older) override;
  void resync_tiered_keys() override;
  // Every key held (the host tier's, then the disk tier's), most recently used first.
  std::vector<uint64_t> tiered_keys() const;

  // Tests: returns once the worker has nothing queued or running (spills, seals, checks).
  void wait_idle_for_tests();

 private:
  struct Job {
    enum class Kind { kOffload, kReload };
    enum class Stage { kCopying, kVerifying, kReadyToCopy, kFailed };
    Kind kind = Kind::kOffload;
    Stage stage = Stage::kCopying;
    std::vector<uint64_t> keys;
    std::vector<int32_t> pool_blocks;
    std::vector<std::optional<int>> host_slots;  // per block: its host slot (else on disk)
    // Offload: blocks that found no host slot, copied to staging memory and written to disk.
    std::vector<TierOffload> direct;
    kv_transfer::StagingMemory direct_staging;
    std::vector<std::byte*> sources;     // reload: each block's bytes to copy
    kv_transfer::StagingMemory staging;  // reload: the disk blocks' bytes
    kv_transfer::CopyBatchId batch = 0;
    std::chrono::steady_clock::time_point start;
    Status status;
    int host_blocks = 0;
    int disk_blocks = 0;
  };
  using Task = std::function<void()>;

  TierStore(TierStoreOptions options, std::unique_ptr<HostTier> host,
            std::unique_ptr<DiskTier> disk, std::shared_ptr<TierFiles> files);

  std::vector<kv_transfer::PoolCopy> block_copies(int32_t pool_block, std::byte* host) const;
  // With mutex_ held: a free host slot for `id`, evicting for good when there is no disk tier.
  std::optional<int> reserve_slot(const TieredBlockId& id);
  // With mutex_ held: starts spilling LRU host blocks until enough slots are free or on their
  // way to the disk tier.
  void spill_ahead();
  void drop_host(int slot);  // with mutex_ held; journals the key's removal
  std::vector<uint64_t> tiered_keys_locked() const;
  // At shutdown, with a disk tier: the host tier's blocks written to disk (within
  // kShutdownFlushBudget), so that a restart finds them.
  void flush_host_to_disk();
  void unpin(Job& job);      // with mutex_ held
  void post(Task task);
  void run_worker();
  // Worker tasks.
  void seal(int slot);
  void spill(int slot);
  void write_direct(const std::vector<TierOffload>& blocks, const std::byte* bytes);
  // Writes a block file and indexes it (evicting LRU files); its error when not stored.
  Status store_on_disk(const TieredBlockId& id, uint64_t checksum, const std::byte* bytes);
  void verify(TierJobId job);
  bool verify_disk_block(uint64_t key, const TieredBlockId& expected, uint64_t checksum,
                         std::byte* out);
  void count_error(int64_t& counter, const std::string& what, const Status& status);
  void notify_engine();

  KvLayout layout_;
  std::mutex wakeup_mutex_;
  std::function<void()> wakeup_;
  std::shared_ptr<kv_transfer::PoolCopier> copier_;
  std::shared_ptr<TierFiles> files_;

  mutable std::mutex mutex_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<DiskTier> disk_;
  std::map<TierJobId, Job> jobs_;
  std::unordered_set<uint64_t> direct_keys_;  // on their way straight to disk
  TierJobId next_job_ = 1;
  PrefixCacheJournal journal_{kPrefixJournalCapacity};
  KvTierStats stats_;

  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<Task> tasks_;
  bool worker_busy_ = false;
  bool stopping_ = false;
  std::thread worker_;  // last: started after everything it reads
};

}  // namespace pdserve::kv_tiers
