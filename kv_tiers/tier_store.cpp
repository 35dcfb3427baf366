#include "kv_tiers/tier_store.h"

#include <algorithm>
#include <bit>
#include <sstream>
#include <utility>

#include "common/core/files.h"
#include "common/core/log.h"
#include "kv_transfer/kv_checksum.h"

namespace pdserve::kv_tiers {
namespace {

using Clock = std::chrono::steady_clock;

// The most a shutdown waits for the host tier's blocks to reach the disk tier.
constexpr auto kShutdownFlushBudget = std::chrono::seconds(10);

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool same_block(const TieredBlockId& a, const TieredBlockId& b) {
  return a.key == b.key && a.parent_key == b.parent_key && a.tokens == b.tokens;
}

}  // namespace

std::string kv_tier_fingerprint(const std::filesystem::path& model_dir, const KvLayout& layout) {
  std::ostringstream out;
  out << "layers=" << layout.num_layers << ";block_size=" << layout.block_size
      << ";kv_heads=" << layout.num_kv_heads << ";head_dim=" << layout.head_dim
      << ";dtype=" << static_cast<int>(layout.dtype) << ";config=";
  const Result<std::string> config = read_text_file(model_dir / "config.json");
  out << (config.ok() ? std::to_string(std::hash<std::string>{}(*config)) : "unreadable");
  std::error_code error;
  std::vector<std::string> weights;
  for (const auto& entry : std::filesystem::directory_iterator(model_dir, error)) {
    if (entry.path().extension() != ".safetensors") continue;
    const auto size = entry.file_size(error);
    const auto written = entry.last_write_time(error).time_since_epoch().count();
    weights.push_back(entry.path().filename().string() + ":" + std::to_string(size) + ":" +
                      std::to_string(written));
  }
  std::ranges::sort(weights);
  for (const std::string& weight : weights) out << ";" << weight;
  return out.str();
}

Result<std::unique_ptr<TierStore>> TierStore::create(TierStoreOptions options) {
  const uint64_t block_bytes = options.layout.bytes_per_block();
  if (block_bytes == 0 || options.copier == nullptr) {
    return invalid_argument("KV tiers: no KV layout or pool copier");
  }
  if (options.host_capacity_bytes < block_bytes) {
    return invalid_argument("--kv-offload-host-gib holds no KV block (" +
                            std::to_string(block_bytes) + " bytes each)");
  }
  std::shared_ptr<TierFiles> files =
      options.files ? options.files : std::make_shared<PosixTierFiles>();
  std::unique_ptr<DiskTier> disk;
  if (!options.disk_dir.empty()) {
    DiskTierOptions disk_options{options.disk_dir, options.disk_capacity_bytes, options.fingerprint,
                                 block_bytes, options.layout.block_size};
    if (options.disk_capacity_bytes <
        block_file_head_bytes(options.layout.block_size) + block_bytes) {
      return invalid_argument("--kv-offload-disk-gib holds no KV block");
    }
    DiskTier::OpenReport report;
    PDS_ASSIGN_OR_RETURN(disk, DiskTier::open(std::move(disk_options), *files, &report));
    if (report.cleared) {
      PDS_LOG_WARN("KV disk tier " + options.disk_dir.string() +
                   ": its blocks were written for another model or KV layout; cleared");
    }
    if (report.reindexed > 0 || report.dropped > 0) {
      PDS_LOG_INFO("KV disk tier " + options.disk_dir.string() + ": " +
                   std::to_string(report.reindexed) + " blocks kept from before, " +
                   std::to_string(report.dropped) + " damaged files removed");
    }
  }
  const int num_slots = static_cast<int>(options.host_capacity_bytes / block_bytes);
  PDS_ASSIGN_OR_RETURN(
      kv_transfer::StagingMemory memory,
      options.copier->allocate_staging(static_cast<size_t>(num_slots) * block_bytes));
  auto host = std::make_unique<HostTier>(std::move(memory), num_slots, block_bytes);
  return std::unique_ptr<TierStore>(
      new TierStore(std::move(options), std::move(host), std::move(disk), std::move(files)));
}

TierStore::TierStore(TierStoreOptions options, std::unique_ptr<HostTier> host,
                     std::unique_ptr<DiskTier> disk, std::shared_ptr<TierFiles> files)
    : layout_(options.layout),
      copier_(std::move(options.copier)),
      files_(std::move(files)),
      host_(std::move(host)),
      disk_(std::move(disk)) {
  stats_.enabled = true;
  stats_.host.capacity_bytes = static_cast<int64_t>(host_->num_slots() * block_bytes());
  if (disk_) stats_.disk.capacity_bytes = static_cast<int64_t>(disk_->options().capacity_bytes);
  for (uint64_t key : disk_ ? disk_->keys() : std::vector<uint64_t>{}) journal_.record_stored(key);
  copier_->set_on_finished([this] { notify_engine(); });
  worker_ = std::thread([this] { run_worker(); });
}

TierStore::~TierStore() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  worker_.join();
  copier_->set_on_finished({});
  // Copies still running write or read this store's memory: wait for them (bounded).
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  for (auto& [id, job] : jobs_) {
    if (job.stage != Job::Stage::kCopying) continue;
    while (Clock::now() < deadline) {
      Result<bool> done = copier_->finished(job.batch);
      if (!done.ok() || *done) break;
      std::this_thread::yield();
    }
  }
  flush_host_to_disk();
}

void TierStore::flush_host_to_disk() {
  if (!disk_) return;
  // The worker has stopped and no copy runs: the host tier's blocks are written least recently
  // used first, so that the disk tier's LRU keeps the most recent when it is full.
  const auto deadline = Clock::now() + kShutdownFlushBudget;
  int written = 0;
  std::unique_lock lock(mutex_);
  for (std::optional<int> slot = host_->lru_victim(); slot; slot = host_->lru_victim()) {
    if (Clock::now() >= deadline) break;
    if (disk_->find(host_->slot(*slot).id.key)) {
      host_->release(*slot);
      continue;
    }
    host_->start_spill(*slot);
    lock.unlock();
    spill(*slot);
    lock.lock();
    ++written;
  }
  const int left = host_->num_ready();
  if (written + left > 0) {
    PDS_LOG_INFO("KV tiers: wrote " + std::to_string(written) +
                 " host-tier blocks to the disk tier at shutdown" +
                 (left > 0 ? " (" + std::to_string(left) + " left out: past the time budget)"
                           : std::string()));
  }
}

std::vector<kv_transfer::PoolCopy> TierStore::block_copies(int32_t pool_block,
                                                           std::byte* host) const {
  std::vector<kv_transfer::PoolCopy> copies;
  const uint64_t half = layout_.layer_block_bytes();
  for (int layer = 0; layer < layout_.num_layers; ++layer) {
    for (bool value_half : {false, true}) {
      copies.push_back({layout_.offset(layer, pool_block, value_half), host, half});
      host += half;
    }
  }
  return copies;
}

bool TierStore::holds(uint64_t key) const {
  std::lock_guard lock(mutex_);
  return host_->find(key).has_value() || direct_keys_.contains(key) ||
         (disk_ && disk_->find(key) != nullptr);
}

void TierStore::drop_host(int slot) {
  const uint64_t key = host_->slot(slot).id.key;
  // Journaled as stored once sealed; a doomed block was journaled as removed already.
  const HostTier::SlotState state = host_->slot(slot).state;
  const bool was_hit =
      state == HostTier::SlotState::kReady || state == HostTier::SlotState::kSpilling;
  host_->release(slot);
  if (was_hit && !(disk_ && disk_->find(key))) journal_.record_removed(key);
}

std::optional<int> TierStore::reserve_slot(const TieredBlockId& id) {
  if (std::optional<int> slot = host_->reserve(id)) return slot;
  if (disk_) return std::nullopt;  // spill_ahead frees slots through the disk tier
  const std::optional<int> victim = host_->lru_victim();
  if (!victim) return std::nullopt;
  drop_host(*victim);
  return host_->reserve(id);
}

Result<TierJobId> TierStore::start_offload(std::span<const TierOffload> blocks) {
  std::lock_guard lock(mutex_);
  Job job;
  job.kind = Job::Kind::kOffload;
  std::vector<kv_transfer::PoolCopy> copies;
  for (const TierOffload& block : blocks) {
    if (host_->find(block.id.key) || (disk_ && disk_->find(block.id.key))) continue;
    if (direct_keys_.contains(block.id.key)) continue;
    const std::optional<int> slot = reserve_slot(block.id);
    if (!slot) {
      // The host tier is full of blocks on their way down: this one goes straight to disk.
      if (disk_) {
        job.direct.push_back(block);
      } else {
        ++stats_.offloads_skipped_total;
      }
      continue;
    }
    job.keys.push_back(block.id.key);
    job.pool_blocks.push_back(block.pool_block);
    job.host_slots.push_back(*slot);
    for (const auto& copy : block_copies(block.pool_block, host_->data(*slot))) {
      copies.push_back(copy);
    }
  }
  if (!job.direct.empty()) {
    Result<kv_transfer::StagingMemory> staging =
        copier_->allocate_staging(job.direct.size() * block_bytes());
    if (staging.ok()) {
      job.direct_staging = std::move(*staging);
      std::byte* at = job.direct_staging.get();
      for (const TierOffload& block : job.direct) {
        direct_keys_.insert(block.id.key);
        for (const auto& copy : block_copies(block.pool_block, at)) copies.push_back(copy);
        at += block_bytes();
      }
    } else {
      stats_.offloads_skipped_total += static_cast<int64_t>(job.direct.size());
      job.direct.clear();
    }
  }
  if (copies.empty()) return resource_exhausted("KV tiers: no block to offload found room");
  Result<kv_transfer::CopyBatchId> batch =
      copier_->start(kv_transfer::CopyDirection::kToHost, copies);
  if (!batch.ok()) {
    for (const std::optional<int>& slot : job.host_slots) host_->release(*slot);
    for (const TierOffload& block : job.direct) direct_keys_.erase(block.id.key);
    return batch.status().with_context("KV tiers: offload");
  }
  job.batch = *batch;
  job.start = Clock::now();
  const TierJobId id = next_job_++;
  jobs_.emplace(id, std::move(job));
  spill_ahead();
  return id;
}

std::vector<KvTier> TierStore::match(std::span<const TieredBlockId> blocks) {
  std::lock_guard lock(mutex_);
  std::vector<KvTier> tiers;
  for (const TieredBlockId& block : blocks) {
    if (const std::optional<int> slot = host_->find(block.key)) {
      const HostTier::Slot& entry = host_->slot(*slot);
      if (entry.state != HostTier::SlotState::kReady || !same_block(entry.id, block)) break;
      tiers.push_back(KvTier::kHost);
      continue;
    }
    const DiskTier::Entry* entry = disk_ ? disk_->find(block.key) : nullptr;
    if (entry == nullptr || !same_block(entry->id, block)) break;
    tiers.push_back(KvTier::kDisk);
  }
  return tiers;
}

Result<TierJobId> TierStore::start_reload(std::span<const TierReload> blocks) {
  std::unique_lock lock(mutex_);
  Job job;
  job.kind = Job::Kind::kReload;
  job.stage = Job::Stage::kVerifying;
  for (const TierReload& block : blocks) {
    job.keys.push_back(block.key);
    job.pool_blocks.push_back(block.pool_block);
    const std::optional<int> slot = host_->find(block.key);
    if (slot && host_->slot(*slot).state == HostTier::SlotState::kReady) {
      ++host_->slot(*slot).readers;
      host_->touch(*slot);
      job.host_slots.push_back(slot);
      ++job.host_blocks;
      continue;
    }
    job.host_slots.push_back(std::nullopt);
    DiskTier::Entry* entry = disk_ ? disk_->find(block.key) : nullptr;
    if (entry == nullptr) {
      job.keys.pop_back();
      job.host_slots.pop_back();
      unpin(job);
      return not_found("KV tiers: a block left the tiers before its reload");
    }
    ++entry->readers;
    disk_->touch(block.key);
    ++job.disk_blocks;
  }
  if (job.disk_blocks > 0) {
    Result<kv_transfer::StagingMemory> staging =
        copier_->allocate_staging(static_cast<size_t>(job.disk_blocks) * block_bytes());
    if (!staging.ok()) {
      unpin(job);
      return staging.status().with_context("KV tiers: reload staging");
    }
    job.staging = std::move(*staging);
  }
  std::byte* next_staged = job.staging.get();
  for (const std::optional<int>& slot : job.host_slots) {
    if (slot) {
      job.sources.push_back(host_->data(*slot));
    } else {
      job.sources.push_back(next_staged);
      next_staged += block_bytes();
    }
  }
  job.start = Clock::now();
  const TierJobId id = next_job_++;
  jobs_.emplace(id, std::move(job));
  lock.unlock();
  post([this, id] { verify(id); });
  return id;
}

void TierStore::unpin(Job& job) {
  for (size_t i = 0; i < job.keys.size(); ++i) {
    if (const std::optional<int>& slot = job.host_slots[i]) {
      HostTier::Slot& entry = host_->slot(*slot);
      if (--entry.readers == 0 && entry.state == HostTier::SlotState::kDoomed) {
        host_->release(*slot);
      }
    } else if (DiskTier::Entry* entry = disk_ ? disk_->find(job.keys[i]) : nullptr) {
      --entry->readers;
    }
  }
}

std::vector<TierJobResult> TierStore::poll() {
  std::vector<TierJobResult> results;
  std::vector<int> to_seal;
  std::vector<std::pair<std::vector<TierOffload>, kv_transfer::StagingMemory>> to_write;
  {
    std::lock_guard lock(mutex_);
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      Job& job = it->second;
      if (job.stage == Job::Stage::kReadyToCopy) {
        std::vector<kv_transfer::PoolCopy> copies;
        for (size_t i = 0; i < job.keys.size(); ++i) {
          for (const auto& copy : block_copies(job.pool_blocks[i], job.sources[i])) {
            copies.push_back(copy);
          }
        }
        Result<kv_transfer::CopyBatchId> batch =
            copier_->start(kv_transfer::CopyDirection::kToPool, copies);
        if (batch.ok()) {
          job.batch = *batch;
          job.stage = Job::Stage::kCopying;
        } else {
          job.status = batch.status().with_context("KV tiers: reload");
          job.stage = Job::Stage::kFailed;
        }
      }
      bool done = job.stage == Job::Stage::kFailed;
      if (job.stage == Job::Stage::kCopying) {
        Result<bool> finished = copier_->finished(job.batch);
        if (!finished.ok()) job.status = finished.status().with_context("KV tiers: copy");
        done = !finished.ok() || *finished;
      }
      if (!done) {
        ++it;
        continue;
      }
      TierJobResult result;
      result.job = it->first;
      result.status = job.status;
      result.seconds = seconds_since(job.start);
      if (job.status.ok()) {
        result.blocks = static_cast<int>(job.keys.size() + job.direct.size());
        result.host_blocks = job.host_blocks;
        result.disk_blocks = job.disk_blocks;
        result.bytes = static_cast<uint64_t>(result.blocks) * block_bytes();
      }
      if (job.kind == Job::Kind::kOffload) {
        for (const std::optional<int>& slot : job.host_slots) {
          if (job.status.ok()) {
            to_seal.push_back(*slot);
          } else {
            host_->release(*slot);
          }
        }
        if (!job.direct.empty() && job.status.ok()) {
          to_write.emplace_back(std::move(job.direct), std::move(job.direct_staging));
        } else {
          for (const TierOffload& block : job.direct) direct_keys_.erase(block.id.key);
        }
        if (job.status.ok()) {
          stats_.offloaded_blocks_total += result.blocks;
          stats_.offloaded_bytes_total += static_cast<int64_t>(result.bytes);
          stats_.offload_seconds_total += result.seconds;
        }
      } else {
        unpin(job);
        if (job.status.ok()) {
          stats_.reloaded_blocks_total += result.blocks;
          stats_.reloaded_bytes_total += static_cast<int64_t>(result.bytes);
          stats_.reload_seconds_total += result.seconds;
          stats_.host.hit_blocks_total += job.host_blocks;
          stats_.disk.hit_blocks_total += job.disk_blocks;
        }
      }
      results.push_back(std::move(result));
      it = jobs_.erase(it);
    }
  }
  for (int slot : to_seal) post([this, slot] { seal(slot); });
  for (auto& [blocks, staging] : to_write) {
    auto memory = std::make_shared<kv_transfer::StagingMemory>(std::move(staging));
    post([this, blocks = std::move(blocks), memory] { write_direct(blocks, memory->get()); });
  }
  return results;
}

void TierStore::set_wakeup(std::function<void()> wakeup) {
  std::lock_guard lock(wakeup_mutex_);
  wakeup_ = std::move(wakeup);
}

void TierStore::notify_engine() {
  std::lock_guard lock(wakeup_mutex_);
  if (wakeup_) wakeup_();
}

bool TierStore::busy() const {
  std::lock_guard lock(mutex_);
  return !jobs_.empty();
}

void TierStore::post(Task task) {
  {
    std::lock_guard lock(mutex_);
    tasks_.push_back(std::move(task));
  }
  wake_.notify_one();
}

void TierStore::run_worker() {
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
    if (stopping_) return;
    Task task = std::move(tasks_.front());
    tasks_.pop_front();
    worker_busy_ = true;
    lock.unlock();
    task();
    lock.lock();
    worker_busy_ = false;
    if (tasks_.empty()) idle_.notify_all();
  }
}

void TierStore::wait_idle_for_tests() {
  std::unique_lock lock(mutex_);
  idle_.wait_for(lock, std::chrono::seconds(30),
                 [this] { return tasks_.empty() && !worker_busy_; });
}

void TierStore::seal(int slot) {
  // The slot is landing: nobody else reads or writes it until it is sealed.
  const uint64_t checksum = kv_transfer::bytes_checksum({host_->data(slot), block_bytes()});
  std::lock_guard lock(mutex_);
  host_->seal(slot, checksum);
  journal_.record_stored(host_->slot(slot).id.key);
  spill_ahead();
}

void TierStore::spill_ahead() {
  if (!disk_) return;
  const int want_free = std::max(1, host_->num_slots() / 8);
  while (host_->num_free() + host_->num_spilling() < want_free) {
    const std::optional<int> victim = host_->lru_victim();
    if (!victim) return;
    if (!disk_->can_take_one()) {
      drop_host(*victim);
      continue;
    }
    host_->start_spill(*victim);
    tasks_.push_back([this, slot = *victim] { spill(slot); });
  }
  wake_.notify_one();
}

void TierStore::count_error(int64_t& counter, const std::string& what, const Status& status) {
  // Logged at 1, 2, 4, 8...: a full disk must not flood the log.
  if (std::has_single_bit(static_cast<uint64_t>(++counter))) {
    PDS_LOG_WARN("KV tiers: " + what + " (" + std::to_string(counter) +
                 " so far; the cache loses the block, no request fails): " + status.message());
  }
}

void TierStore::spill(int slot) {
  // The slot is spilling: its bytes and id stay as they are until it is released.
  const HostTier::Slot& entry = host_->slot(slot);
  const Status written = store_on_disk(entry.id, entry.checksum, host_->data(slot));
  std::lock_guard lock(mutex_);
  if (written.ok()) {
    host_->release(slot);  // the key stays tiered: no journal change
  } else {
    drop_host(slot);
  }
}

void TierStore::write_direct(const std::vector<TierOffload>& blocks, const std::byte* bytes) {
  for (const TierOffload& block : blocks) {
    const uint64_t checksum = kv_transfer::bytes_checksum({bytes, block_bytes()});
    const bool stored = store_on_disk(block.id, checksum, bytes).ok();
    bytes += block_bytes();
    std::lock_guard lock(mutex_);
    direct_keys_.erase(block.id.key);
    if (stored) journal_.record_stored(block.id.key);
  }
}

Status TierStore::store_on_disk(const TieredBlockId& id, uint64_t checksum,
                                const std::byte* bytes) {
  const std::vector<std::byte> head = encode_block_file_head(id, checksum, block_bytes());
  const std::span<const std::byte> parts[] = {head, {bytes, block_bytes()}};
  const Status written = files_->write(disk_->path_of(id.key), parts);
  std::vector<uint64_t> evicted;
  {
    std::lock_guard lock(mutex_);
    if (!written.ok()) {
      count_error(stats_.disk_write_errors_total, "writing a block to the disk tier failed",
                  written);
      return written;
    }
    evicted = disk_->insert(id, checksum);
    for (uint64_t gone : evicted) {
      if (gone != id.key) journal_.record_removed(gone);
    }
  }
  for (uint64_t gone : evicted) (void)files_->remove(disk_->path_of(gone));
  if (std::ranges::find(evicted, id.key) != evicted.end()) {
    return resource_exhausted("the disk tier is full of blocks being read");
  }
  return Status::ok_status();
}

bool TierStore::verify_disk_block(uint64_t key, const TieredBlockId& expected, uint64_t checksum,
                                  std::byte* out) {
  const std::filesystem::path path = disk_->path_of(key);
  std::vector<std::byte> head_bytes(block_file_head_bytes(layout_.block_size));
  Status problem = Status::ok_status();
  Result<size_t> read = files_->read(path, 0, head_bytes);
  if (read.ok() && *read != head_bytes.size()) read = data_loss(path.string() + " is truncated");
  Result<BlockFileHead> head = read.ok() ? decode_block_file_head(head_bytes, layout_.block_size)
                                         : Result<BlockFileHead>(read.status());
  if (head.ok() && (!same_block(head->id, expected) || head->payload_bytes != block_bytes())) {
    head = data_loss(path.string() + " holds another block");
  }
  if (head.ok()) {
    read = files_->read(path, head->head_bytes, {out, block_bytes()});
    if (read.ok() && *read != block_bytes()) read = data_loss(path.string() + " is truncated");
  }
  if (!head.ok() || !read.ok()) {
    std::lock_guard lock(mutex_);
    count_error(stats_.disk_read_errors_total, "reading a block from the disk tier failed",
                head.ok() ? read.status() : head.status());
    return false;
  }
  if (kv_transfer::bytes_checksum({out, block_bytes()}) != checksum || head->checksum != checksum) {
    std::lock_guard lock(mutex_);
    count_error(stats_.checksum_mismatches_total, "a disk block failed its checksum",
                data_loss(path.string()));
    return false;
  }
  return true;
}

void TierStore::verify(TierJobId id) {
  struct Check {
    uint64_t key;
    std::optional<int> slot;
    TieredBlockId expected;
    uint64_t checksum;
    std::byte* out;
  };
  std::vector<Check> checks;
  {
    std::lock_guard lock(mutex_);
    Job& job = jobs_.at(id);
    for (size_t i = 0; i < job.keys.size(); ++i) {
      if (const std::optional<int>& slot = job.host_slots[i]) {
        const HostTier::Slot& entry = host_->slot(*slot);
        checks.push_back({job.keys[i], slot, entry.id, entry.checksum, job.sources[i]});
      } else {
        const DiskTier::Entry& entry = *disk_->find(job.keys[i]);  // pinned
        checks.push_back({job.keys[i], std::nullopt, entry.id, entry.checksum, job.sources[i]});
      }
    }
  }
  std::vector<Check> bad;
  for (const Check& check : checks) {
    bool good;
    if (check.slot) {
      good = kv_transfer::bytes_checksum({check.out, block_bytes()}) == check.checksum;
      if (!good) {
        std::lock_guard lock(mutex_);
        count_error(stats_.checksum_mismatches_total, "a host block failed its checksum",
                    data_loss("host slot " + std::to_string(*check.slot)));
      }
    } else {
      good = verify_disk_block(check.key, check.expected, check.checksum, check.out);
    }
    if (!good) bad.push_back(check);
  }
  std::vector<uint64_t> to_remove;
  {
    std::lock_guard lock(mutex_);
    Job& job = jobs_.at(id);
    for (const Check& check : bad) {
      if (check.slot) {
        host_->doom(*check.slot);
      } else if (disk_->find(check.key) != nullptr) {
        // Unpinned here so that the job's unpin does not find it.
        disk_->erase(check.key);
        const auto position = std::ranges::find(job.keys, check.key) - job.keys.begin();
        job.keys.erase(job.keys.begin() + position);
        job.host_slots.erase(job.host_slots.begin() + position);
        job.sources.erase(job.sources.begin() + position);
        job.pool_blocks.erase(job.pool_blocks.begin() + position);
        to_remove.push_back(check.key);
      }
      journal_.record_removed(check.key);
    }
    if (bad.empty()) {
      job.stage = Job::Stage::kReadyToCopy;
    } else {
      job.stage = Job::Stage::kFailed;
      job.status = data_loss("KV tiers: " + std::to_string(bad.size()) +
                             " block(s) failed their checks on the way back");
    }
  }
  for (uint64_t key : to_remove) (void)files_->remove(disk_->path_of(key));
  notify_engine();
}

KvTierStats TierStore::stats() const {
  std::lock_guard lock(mutex_);
  KvTierStats stats = stats_;
  stats.host.blocks = host_->num_ready();
  stats.host.bytes = static_cast<int64_t>(host_->num_held()) * static_cast<int64_t>(block_bytes());
  if (disk_) {
    stats.disk.blocks = disk_->num_blocks();
    stats.disk.bytes = static_cast<int64_t>(disk_->used_bytes());
  }
  return stats;
}

PrefixCacheChanges TierStore::take_tiered_changes() {
  std::lock_guard lock(mutex_);
  if (journal_.needs_snapshot()) journal_.set_snapshot(tiered_keys_locked());
  return journal_.take();
}

void TierStore::restore_tiered_changes(const PrefixCacheChanges& older) {
  std::lock_guard lock(mutex_);
  journal_.restore_older(older);
}

void TierStore::resync_tiered_keys() {
  std::lock_guard lock(mutex_);
  journal_.request_snapshot();
}

std::vector<uint64_t> TierStore::tiered_keys() const {
  std::lock_guard lock(mutex_);
  return tiered_keys_locked();
}

std::vector<uint64_t> TierStore::tiered_keys_locked() const {
  std::vector<uint64_t> keys = host_->keys();
  if (disk_) {
    for (uint64_t key : disk_->keys()) keys.push_back(key);
  }
  return keys;
}

}  // namespace pdserve::kv_tiers
