// pdserve-bench-kv-tiers: the lower KV tiers' bandwidth (issue #32 item 5) against the limits
// measured in the same run, on a host pool (the CPU backend's) of a Qwen3 layout:
//   memcpy        one contiguous copy of the same bytes (the host tier's ceiling)
//   offload       pool -> host tier, all blocks in one job (PoolCopier batch), as the engine does;
//                 first into fresh host memory (its pages faulted in), then into touched slots
//   host reload   host tier -> pool, checksums verified first
//   disk spill    host tier -> disk tier files (the worker's writes), until the host is drained
//   disk reload   disk tier -> pool with the files out of the page cache (fadvise DONTNEED after
//                 fdatasync), checksums verified
//   disk read     plain pread of the same files out of the page cache (the disk's read rate)
// Each figure is the best of --repeats runs, in GB/s (1e9 bytes).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include "common/core/cli.h"
#include "common/engine/block_hash.h"
#include "kv_tiers/tier_store.h"
#include "kv_transfer/host_pool_copier.h"

namespace pdserve {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int layers = 28;  // Qwen3-0.6B
  int kv_heads = 8;
  int head_dim = 128;
  int block_size = 16;
  std::string dtype = "bfloat16";
  int blocks = 128;
  int repeats = 3;
  std::string dir = "/tmp/pdserve-bench-kv-tiers";
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TierJobResult wait(KvTierStore& store, Result<TierJobId> job) {
  if (!job.ok()) {
    std::fprintf(stderr, "error: %s\n", job.status().to_string().c_str());
    std::exit(1);
  }
  while (true) {
    for (TierJobResult& result : store.poll()) {
      if (result.job != *job) continue;
      if (!result.status.ok()) {
        std::fprintf(stderr, "error: %s\n", result.status.to_string().c_str());
        std::exit(1);
      }
      return result;
    }
    std::this_thread::yield();
  }
}

std::vector<TieredBlockId> chain(int blocks, int block_size, uint32_t seed) {
  std::mt19937 random(seed);
  std::vector<TieredBlockId> ids;
  uint64_t parent = kRootBlockHash;
  for (int i = 0; i < blocks; ++i) {
    TieredBlockId id;
    id.parent_key = parent;
    for (int t = 0; t < block_size; ++t)
      id.tokens.push_back(static_cast<int32_t>(random() % 150000));
    id.key = hash_block_tokens(parent, id.tokens);
    parent = id.key;
    ids.push_back(std::move(id));
  }
  return ids;
}

// Drops the disk tier's files from the page cache, so the next reads come from the disk.
void evict_page_cache(const std::filesystem::path& dir) {
  for (const auto& entry : std::filesystem::directory_iterator(dir / "blocks")) {
    const int fd = ::open(entry.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

int run(const Options& options) {
  KvLayout layout;
  layout.num_layers = options.layers;
  layout.num_kv_heads = options.kv_heads;
  layout.head_dim = options.head_dim;
  layout.block_size = options.block_size;
  layout.dtype = options.dtype == "float32" ? DType::kF32 : DType::kBF16;
  layout.num_blocks = 2 * options.blocks;
  const uint64_t block_bytes = layout.bytes_per_block();
  const uint64_t bytes = block_bytes * static_cast<uint64_t>(options.blocks);
  std::vector<std::byte> pool(layout.total_bytes());
  std::mt19937_64 random(1);
  for (size_t i = 0; i + 8 <= pool.size(); i += 8) {
    const uint64_t value = random();
    std::memcpy(pool.data() + i, &value, 8);
  }
  std::printf(
      "layout: %d layers, %d KV heads x %d, block %d tokens, %s: %.2f MiB per block; "
      "%d blocks (%.1f MiB) per run\n",
      options.layers, options.kv_heads, options.head_dim, options.block_size, options.dtype.c_str(),
      block_bytes / 1048576.0, options.blocks, bytes / 1048576.0);

  auto gbps = [](uint64_t moved, double seconds) { return moved / seconds / 1e9; };
  double memcpy_best = 0, offload_best = 0, warm_offload_best = 0, host_reload_best = 0,
         spill_best = 0, disk_reload_best = 0, disk_read_best = 0;
  std::vector<std::byte> target(bytes);
  for (int repeat = 0; repeat < options.repeats; ++repeat) {
    const auto start = Clock::now();
    std::memcpy(target.data(), pool.data(), bytes);
    memcpy_best = std::max(memcpy_best, gbps(bytes, seconds_since(start)));

    const std::vector<TieredBlockId> ids =
        chain(options.blocks, options.block_size, static_cast<uint32_t>(repeat + 1));
    std::vector<TierOffload> offloads;
    std::vector<TierReload> reloads;
    for (int i = 0; i < options.blocks; ++i) {
      offloads.push_back({ids[static_cast<size_t>(i)], i});
      reloads.push_back({ids[static_cast<size_t>(i)].key, options.blocks + i});
    }
    {  // host tier only
      kv_tiers::TierStoreOptions store_options;
      store_options.layout = layout;
      store_options.copier =
          std::make_shared<kv_transfer::HostPoolCopier>(pool.data(), pool.size());
      store_options.host_capacity_bytes = bytes;
      auto store = kv_tiers::TierStore::create(std::move(store_options)).value();
      offload_best =
          std::max(offload_best, gbps(bytes, wait(*store, store->start_offload(offloads)).seconds));
      store->wait_idle_for_tests();
      // Another chain into the same, now touched, slots (the first one's blocks evicted).
      const std::vector<TieredBlockId> again =
          chain(options.blocks, options.block_size, 500u + static_cast<uint32_t>(repeat));
      std::vector<TierOffload> warm;
      for (int i = 0; i < options.blocks; ++i) warm.push_back({again[static_cast<size_t>(i)], i});
      warm_offload_best = std::max(warm_offload_best,
                                   gbps(bytes, wait(*store, store->start_offload(warm)).seconds));
      store->wait_idle_for_tests();
      for (int i = 0; i < options.blocks; ++i) {
        reloads[static_cast<size_t>(i)].key = again[static_cast<size_t>(i)].key;
      }
      host_reload_best = std::max(host_reload_best,
                                  gbps(bytes, wait(*store, store->start_reload(reloads)).seconds));
    }
    {  // a 16-block host tier over the disk tier: nearly every block goes down to disk
      std::filesystem::remove_all(options.dir);
      std::filesystem::create_directories(options.dir);
      kv_tiers::TierStoreOptions store_options;
      store_options.layout = layout;
      store_options.copier =
          std::make_shared<kv_transfer::HostPoolCopier>(pool.data(), pool.size());
      store_options.host_capacity_bytes = 16 * block_bytes;
      store_options.disk_dir = options.dir;
      store_options.disk_capacity_bytes = 2 * bytes + (64 << 20);
      auto store = kv_tiers::TierStore::create(std::move(store_options)).value();
      const auto spill_start = Clock::now();
      for (const TierOffload& offload : offloads) {
        while (true) {  // no free slot: the worker is still spilling
          Result<TierJobId> job = store->start_offload({&offload, 1});
          if (!job.ok()) {
            std::this_thread::yield();
            continue;
          }
          (void)wait(*store, job);
          break;
        }
      }
      store->wait_idle_for_tests();
      spill_best = std::max(spill_best, gbps(bytes, seconds_since(spill_start)));
      const KvTierStats stats = store->stats();
      std::vector<TierReload> on_disk;
      for (int i = 0; i < options.blocks; ++i) {
        const TieredBlockId& id = ids[static_cast<size_t>(i)];
        if (store->match({&id, 1}) == std::vector<KvTier>{KvTier::kDisk}) {
          on_disk.push_back({id.key, options.blocks + i});
        }
      }
      evict_page_cache(options.dir);
      const uint64_t disk_bytes = on_disk.size() * block_bytes;
      if (!on_disk.empty()) {
        disk_reload_best = std::max(
            disk_reload_best, gbps(disk_bytes, wait(*store, store->start_reload(on_disk)).seconds));
      }
      evict_page_cache(options.dir);
      std::vector<std::byte> buffer(block_bytes + 4096);
      uint64_t read_bytes = 0;
      const auto read_start = Clock::now();
      for (const auto& entry :
           std::filesystem::directory_iterator(std::filesystem::path(options.dir) / "blocks")) {
        const int fd = ::open(entry.path().c_str(), O_RDONLY);
        const ssize_t got = ::pread(fd, buffer.data(), buffer.size(), 0);
        if (got > 0) read_bytes += static_cast<uint64_t>(got);
        ::close(fd);
      }
      disk_read_best = std::max(disk_read_best, gbps(read_bytes, seconds_since(read_start)));
      if (repeat == 0) {
        std::printf("disk tier: %lld blocks on disk, %lld in host memory after the spills\n",
                    static_cast<long long>(stats.disk.blocks),
                    static_cast<long long>(stats.host.blocks));
      }
    }
  }
  std::filesystem::remove_all(options.dir);
  std::printf("memcpy       %7.2f GB/s\n", memcpy_best);
  std::printf("offload      %7.2f GB/s  (pool -> host tier, one PoolCopier batch)\n", offload_best);
  std::printf("offload warm %7.2f GB/s  (the same into host slots already touched)\n",
              warm_offload_best);
  std::printf("host reload  %7.2f GB/s  (host tier -> pool, checksums verified)\n",
              host_reload_best);
  std::printf("disk spill   %7.2f GB/s  (block by block: offload, then the worker's file writes)\n",
              spill_best);
  std::printf("disk reload  %7.2f GB/s  (files out of the page cache, checksums verified)\n",
              disk_reload_best);
  std::printf("disk read    %7.2f GB/s  (plain pread of the same files out of the page cache)\n",
              disk_read_best);
  return 0;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  CLI::App app{"pdserve-bench-kv-tiers: KV tier bandwidth against memcpy and the disk's read rate"};
  pdserve::Options options;
  app.add_option("--layers", options.layers)->capture_default_str();
  app.add_option("--kv-heads", options.kv_heads)->capture_default_str();
  app.add_option("--head-dim", options.head_dim)->capture_default_str();
  app.add_option("--block-size", options.block_size)->capture_default_str();
  app.add_option("--dtype", options.dtype)
      ->check(CLI::IsMember({"bfloat16", "float32"}))
      ->capture_default_str();
  app.add_option("--blocks", options.blocks, "Blocks moved per run")
      ->capture_default_str()
      ->check(CLI::Range(8, 65536));
  app.add_option("--repeats", options.repeats)->capture_default_str()->check(CLI::Range(1, 100));
  app.add_option("--dir", options.dir, "Scratch folder of the disk tier (removed)")
      ->capture_default_str();
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  return pdserve::run(options);
}
