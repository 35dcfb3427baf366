// The staging path's parts without UCX (issue #14): the host PoolCopier (asynchronous,
// possibly out-of-order batches), the checksum of staged bytes (BlockChecksumStream) against
// the checksum of the whole pool (prompt_block_checksums), and the send ring (SendStaging):
// bounded buffers, each stream's pieces handed out in order, the bytes those of the pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kv_transfer/host_pool_copier.h"
#include "kv_transfer/kv_checksum.h"
#include "kv_transfer/send_staging.h"

namespace pdserve::kv_transfer {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::vector<std::byte> random_bytes(std::size_t count, std::uint32_t seed) {
  std::vector<std::byte> bytes(count);
  std::mt19937 rng(seed);
  for (std::byte& b : bytes) b = static_cast<std::byte>(rng());
  return bytes;
}

// Polls until the batch finished (or gives up after 10 s): finished() is what the copier's user
// (the KV thread) polls, with no event of its own (on_finished only says that some batch did).
Result<bool> wait_finished(PoolCopier& copier, CopyBatchId batch) {
  const auto give_up = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    Result<bool> done = copier.finished(batch);
    if (!done.ok() || *done || Clock::now() > give_up) return done;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

TEST(HostPoolCopier, CopiesBothWaysInBatchesThatMayFinishOutOfOrder) {
  std::vector<std::byte> pool = random_bytes(1 << 16, 1);
  const std::vector<std::byte> original = pool;
  HostPoolCopier copier(pool.data(), pool.size(), {/*reorder=*/true, /*seed=*/5});
  int notified = 0;
  std::mutex mutex;
  copier.set_on_finished([&] {
    std::lock_guard lock(mutex);
    ++notified;
  });
  Result<StagingMemory> host = copier.allocate_staging(1 << 16);
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(host->get()) % 4096, 0u) << "page-aligned";
  // 16 batches to the host, each a scattered pair of ranges, queued before any is polled.
  copier.set_paused(true);
  std::vector<CopyBatchId> batches;
  for (int i = 0; i < 16; ++i) {
    const std::uint64_t a = static_cast<std::uint64_t>(i) * 2048;
    const std::uint64_t b = static_cast<std::uint64_t>(31 - i) * 2048;
    const PoolCopy copies[] = {{a, host->get() + a, 2048}, {b, host->get() + b, 2048}};
    Result<CopyBatchId> batch = copier.start(CopyDirection::kToHost, copies);
    ASSERT_TRUE(batch.ok()) << batch.status().to_string();
    batches.push_back(*batch);
  }
  EXPECT_EQ(*copier.finished(batches[0]), false) << "paused: nothing is copied";
  copier.set_paused(false);
  for (CopyBatchId batch : batches) ASSERT_TRUE(*wait_finished(copier, batch));
  EXPECT_TRUE(std::equal(pool.begin(), pool.end(), host->get()));
  EXPECT_EQ(copier.finished(batches[0]).status().code(), StatusCode::kNotFound)
      << "a finished batch is reported once";
  // And back into the pool, changed.
  for (std::size_t i = 0; i < pool.size(); ++i) host->get()[i] ^= std::byte{0x5a};
  const PoolCopy whole{0, host->get(), pool.size()};
  Result<CopyBatchId> back = copier.start(CopyDirection::kToPool, {&whole, 1});
  ASSERT_TRUE(back.ok());
  ASSERT_TRUE(*wait_finished(copier, *back));
  for (std::size_t i = 0; i < pool.size(); ++i) {
    ASSERT_EQ(pool[i], original[i] ^ std::byte{0x5a}) << "byte " << i;
  }
  std::lock_guard lock(mutex);
  EXPECT_EQ(notified, 17);
}

TEST(HostPoolCopier, RefusesCopiesOutsideThePoolAndEmptyBatches) {
  std::vector<std::byte> pool(4096);
  std::vector<std::byte> host(8192);
  HostPoolCopier copier(pool.data(), pool.size());
  for (const PoolCopy bad :
       {PoolCopy{4000, host.data(), 200}, PoolCopy{0, host.data(), 0},
        PoolCopy{~std::uint64_t{0} - 8, host.data(), 16}, PoolCopy{0, nullptr, 16}}) {
    EXPECT_EQ(copier.start(CopyDirection::kToHost, {&bad, 1}).status().code(),
              StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(copier.start(CopyDirection::kToPool, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(copier.finished(99).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(copier.batches_done(), 0u);
}

KvLayout checksum_layout() {
  return KvLayout{3, 10, 4, 2, 8, DType::kF32};  // 3 layers, 10 blocks of 4 tokens
}

// The export's puts of prompt blocks (here `blocks`) for every layer: K runs, then V runs,
// consecutive block ids merged, as UcxKvConnector::start_export builds them.
std::vector<BlockCopy> export_puts(const KvLayout& layout, const std::vector<int32_t>& blocks) {
  std::vector<BlockCopy> puts;
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    for (bool value_half : {false, true}) {
      for (std::size_t i = 0; i < blocks.size();) {
        std::size_t run = 1;
        while (i + run < blocks.size() && blocks[i + run] == blocks[i] + int32_t(run)) ++run;
        puts.push_back(
            {layout.offset(layer, blocks[i], value_half), 0, layout.layer_block_bytes() * run});
        i += run;
      }
    }
  }
  return puts;
}

TEST(BlockChecksumStream, EqualsTheWholePoolChecksumsWhateverThePiecesAre) {
  const KvLayout layout = checksum_layout();
  const std::vector<std::byte> pool = random_bytes(layout.total_bytes(), 2);
  const std::vector<int32_t> blocks = {4, 5, 6, 1, 9};  // prompt blocks 2..6, the last partial
  const int first_block = 2;
  const int prompt_tokens = 27;  // blocks of 4: block 6 holds tokens 24..26
  const std::vector<std::uint64_t> expected =
      prompt_block_checksums(pool.data(), layout, blocks, first_block, prompt_tokens);
  std::mt19937 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    BlockChecksumStream stream(layout, blocks, first_block, prompt_tokens);
    for (const BlockCopy& put : export_puts(layout, blocks)) {
      // Cut each put at random block boundaries, as the send ring's slots cut it.
      const std::uint64_t unit = layout.layer_block_bytes();
      for (std::uint64_t done = 0; done < put.bytes;) {
        const std::uint64_t units_left = (put.bytes - done) / unit;
        const std::uint64_t take = unit * (1 + rng() % units_left);
        ASSERT_TRUE(
            stream.add(put.local_offset + done, pool.data() + put.local_offset + done, take).ok());
        done += take;
      }
    }
    Result<std::vector<std::uint64_t>> sums = stream.finish();
    ASSERT_TRUE(sums.ok()) << sums.status().to_string();
    EXPECT_EQ(*sums, expected);
  }
}

TEST(BlockChecksumStream, RefusesHalvesOutOfOrderForeignBlocksAndAnIncompleteStream) {
  const KvLayout layout = checksum_layout();
  const std::vector<std::byte> pool = random_bytes(layout.total_bytes(), 4);
  const std::vector<int32_t> blocks = {3};
  const std::uint64_t unit = layout.layer_block_bytes();
  {
    BlockChecksumStream stream(layout, blocks, 0, 4);
    // Layer 0's V before its K.
    EXPECT_EQ(stream.add(layout.offset(0, 3, true), pool.data(), unit).code(),
              StatusCode::kFailedPrecondition);
  }
  {
    BlockChecksumStream stream(layout, blocks, 0, 4);
    EXPECT_EQ(stream.add(layout.offset(0, 7, false), pool.data(), unit).code(),
              StatusCode::kFailedPrecondition)
        << "block 7 is not the prompt's";
    EXPECT_EQ(stream.add(layout.offset(0, 3, false) + 4, pool.data(), unit).code(),
              StatusCode::kFailedPrecondition)
        << "not at a block boundary";
    ASSERT_TRUE(stream.add(layout.offset(0, 3, false), pool.data(), unit).ok());
    EXPECT_EQ(stream.finish().status().code(), StatusCode::kFailedPrecondition)
        << "only one of six halves";
  }
}

TEST(SendStaging, HandsOutEachStreamsPiecesInOrderWithThePoolsBytesThroughABoundedRing) {
  const std::uint64_t unit = 1024;
  std::vector<std::byte> pool = random_bytes(256 * unit, 5);
  HostPoolCopier copier(pool.data(), pool.size(), {/*reorder=*/true, /*seed=*/9});
  std::vector<std::byte> region(4096 + 3 * 8 * unit);  // 4 KiB before the ring in the region
  Result<std::unique_ptr<SendStaging>> created =
      SendStaging::create(copier, region.data() + 4096, 4096, 3 * 8 * unit, unit);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  SendStaging& ring = **created;
  EXPECT_EQ(ring.num_slots(), 2);
  EXPECT_EQ(ring.slot_bytes(), 12 * unit) << "half the ring, whole units";
  EXPECT_EQ(ring.slot_region_offset(1), 4096 + 12 * unit);
  // Two streams, interleaved: scattered runs, some longer than a slot.
  std::map<std::uint64_t, std::vector<BlockCopy>> puts;
  std::mt19937 rng(6);
  for (std::uint64_t stream : {7u, 8u}) {
    for (int i = 0; i < 12; ++i) {
      const std::uint64_t units = 1 + rng() % 20;
      const std::uint64_t at = rng() % (256 - units);
      puts[stream].push_back({at * unit,
                              1'000'000 * stream + static_cast<std::uint64_t>(i) * 100 * unit,
                              units * unit});
    }
  }
  for (int i = 0; i < 12; ++i) {
    for (std::uint64_t stream : {7u, 8u}) {
      ASSERT_TRUE(ring.enqueue(stream, {&puts[stream][static_cast<std::size_t>(i)], 1}).ok());
    }
  }
  std::map<std::uint64_t, std::size_t> segments;
  for (auto& [stream, list] : puts) {
    for (const BlockCopy& put : list) segments[stream] += (put.bytes + 12 * unit - 1) / (12 * unit);
  }
  std::vector<std::pair<std::uint64_t, Status>> failed;
  int max_busy = 0;
  // The bytes are checked as each fill is handed out, before its slot is reused.
  std::map<std::uint64_t, std::vector<SendStaging::Segment>> seen;
  const auto give_up = Clock::now() + std::chrono::seconds(20);
  std::size_t total = 0;
  while (total < segments[7] + segments[8] && Clock::now() < give_up) {
    for (SendStaging::Filled& fill : ring.advance(failed)) {
      const std::byte* data = ring.slot_data(fill.slot);
      for (const SendStaging::Segment& segment : fill.segments) {
        ASSERT_LE(segment.slot_offset + segment.bytes, ring.slot_bytes());
        ASSERT_TRUE(std::equal(data + segment.slot_offset,
                               data + segment.slot_offset + segment.bytes,
                               pool.begin() + static_cast<std::ptrdiff_t>(segment.pool_offset)))
            << "stream " << fill.stream << " pool offset " << segment.pool_offset;
        seen[fill.stream].push_back(segment);
        ++total;
      }
      max_busy = std::max(max_busy, ring.num_slots() - ring.free_slots());
      ring.release(fill.slot);
    }
  }
  EXPECT_TRUE(failed.empty());
  EXPECT_LE(max_busy, 2) << "never more buffers than the ring has";
  // Each stream's segments, in hand-out order, are its puts cut in order.
  for (auto& [stream, list] : puts) {
    std::vector<BlockCopy> rebuilt;
    for (const SendStaging::Segment& segment : seen[stream]) {
      if (!rebuilt.empty() &&
          rebuilt.back().local_offset + rebuilt.back().bytes == segment.pool_offset &&
          rebuilt.back().remote_offset + rebuilt.back().bytes == segment.remote_offset &&
          rebuilt.back().bytes % (12 * unit) == 0) {
        rebuilt.back().bytes += segment.bytes;
      } else {
        rebuilt.push_back({segment.pool_offset, segment.remote_offset, segment.bytes});
      }
    }
    ASSERT_EQ(rebuilt.size(), list.size()) << "stream " << stream;
    for (std::size_t i = 0; i < list.size(); ++i) {
      EXPECT_EQ(rebuilt[i].local_offset, list[i].local_offset);
      EXPECT_EQ(rebuilt[i].remote_offset, list[i].remote_offset);
      EXPECT_EQ(rebuilt[i].bytes, list[i].bytes);
    }
    EXPECT_TRUE(ring.idle(stream));
  }
}

// Counts the copies of each batch it passes on to the host copier.
class CountingCopier : public PoolCopier {
 public:
  explicit CountingCopier(PoolCopier& inner) : inner_(inner) {}
  std::string description() const override { return inner_.description(); }
  std::uint64_t pool_bytes() const override { return inner_.pool_bytes(); }
  Result<StagingMemory> allocate_staging(std::size_t bytes) override {
    return inner_.allocate_staging(bytes);
  }
  Result<CopyBatchId> start(CopyDirection direction, std::span<const PoolCopy> copies) override {
    batch_sizes.push_back(copies.size());
    return inner_.start(direction, copies);
  }
  Result<bool> finished(CopyBatchId batch) override { return inner_.finished(batch); }
  void set_on_finished(std::function<void()> notify) override {
    inner_.set_on_finished(std::move(notify));
  }
  std::vector<std::size_t> batch_sizes;

 private:
  PoolCopier& inner_;
};

// Puts whose pool ranges follow each other (a run the peer's pool splits) fill their slot with
// one copy; a gap in the pool starts another.
TEST(SendStaging, PoolContiguousPutsAreOneCopy) {
  const std::uint64_t unit = 1024;
  std::vector<std::byte> pool = random_bytes(64 * unit, 8);
  HostPoolCopier host(pool.data(), pool.size());
  CountingCopier copier(host);
  std::vector<std::byte> ring_memory(2 * 16 * unit);
  Result<std::unique_ptr<SendStaging>> created =
      SendStaging::create(copier, ring_memory.data(), 0, ring_memory.size(), unit);
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  SendStaging& ring = **created;
  // Pool units 4-5, 6, 7-9 (contiguous; remote offsets scattered), then 20: two copies.
  const std::vector<BlockCopy> puts = {{4 * unit, 100 * unit, 2 * unit},
                                       {6 * unit, 50 * unit, unit},
                                       {7 * unit, 10 * unit, 3 * unit},
                                       {20 * unit, 0, unit}};
  ASSERT_TRUE(ring.enqueue(1, puts).ok());
  std::vector<std::pair<std::uint64_t, Status>> failed;
  std::vector<SendStaging::Segment> seen;
  const auto give_up = Clock::now() + std::chrono::seconds(10);
  while (seen.size() < puts.size() && Clock::now() < give_up) {
    for (SendStaging::Filled& fill : ring.advance(failed)) {
      const std::byte* data = ring.slot_data(fill.slot);
      for (const SendStaging::Segment& segment : fill.segments) {
        EXPECT_TRUE(std::equal(data + segment.slot_offset,
                               data + segment.slot_offset + segment.bytes,
                               pool.begin() + static_cast<std::ptrdiff_t>(segment.pool_offset)));
        seen.push_back(segment);
      }
      ring.release(fill.slot);
    }
  }
  EXPECT_TRUE(failed.empty());
  ASSERT_EQ(seen.size(), puts.size()) << "each put stays its own segment (its own remote range)";
  for (std::size_t i = 0; i < puts.size(); ++i) {
    EXPECT_EQ(seen[i].remote_offset, puts[i].remote_offset);
  }
  EXPECT_EQ(copier.batch_sizes, std::vector<std::size_t>{2});
}

TEST(SendStaging, AStreamWaitsForAFreeBufferAndADroppedOneFreesItsBuffers) {
  const std::uint64_t unit = 512;
  std::vector<std::byte> pool = random_bytes(64 * unit, 7);
  HostPoolCopier copier(pool.data(), pool.size());
  std::vector<std::byte> ring_memory(4 * unit);
  auto ring = SendStaging::create(copier, ring_memory.data(), 0, ring_memory.size(), unit);
  ASSERT_TRUE(ring.ok());
  EXPECT_EQ((*ring)->num_slots(), 2);
  const BlockCopy big{0, 0, 8 * unit};  // four slots' worth
  const BlockCopy small{32 * unit, 0, unit};
  ASSERT_TRUE((*ring)->enqueue(1, {&big, 1}).ok());
  ASSERT_TRUE((*ring)->enqueue(2, {&small, 1}).ok());
  std::vector<std::pair<std::uint64_t, Status>> failed;
  std::vector<SendStaging::Filled> out;
  const auto give_up = Clock::now() + std::chrono::seconds(10);
  while (out.size() < 2 && Clock::now() < give_up) {
    for (auto& fill : (*ring)->advance(failed)) out.push_back(fill);
  }
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].stream, 1u);
  EXPECT_EQ(out[1].stream, 1u);
  // Both buffers are held (their puts still read them): stream 2 waits, first come first served.
  EXPECT_TRUE((*ring)->waiting_for_slot(2));
  EXPECT_FALSE((*ring)->idle(2));
  EXPECT_TRUE((*ring)->advance(failed).empty());
  // Dropping stream 1 frees nothing held by its puts (their owner releases those), but its
  // queued pieces go; once a buffer is released, stream 2 gets it before any of stream 1's.
  (*ring)->drop(1);
  EXPECT_TRUE((*ring)->idle(1));
  (*ring)->release(out[0].slot);
  out.clear();
  const auto give_up_again = Clock::now() + std::chrono::seconds(10);
  while (out.empty() && Clock::now() < give_up_again) {
    for (auto& fill : (*ring)->advance(failed)) out.push_back(fill);
  }
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].stream, 2u);
  EXPECT_TRUE((*ring)->idle(2));
  EXPECT_TRUE(failed.empty());
  // Pieces that are not whole units are refused, and nothing of the call is queued.
  const BlockCopy ragged[] = {{0, 0, unit}, {0, 0, unit + 1}};
  EXPECT_EQ((*ring)->enqueue(3, ragged).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE((*ring)->idle(3));
  // A ring too small for two buffers of one unit is refused.
  EXPECT_EQ(SendStaging::create(copier, ring_memory.data(), 0, unit, unit).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::kv_transfer
