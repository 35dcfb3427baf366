// Which bytes a transferred block's checksum covers (kv_transfer/kv_checksum.h), against an
// oracle that gathers them with its own index arithmetic over the pool's documented layout
// (K then V, each [layers][blocks][block_size][kv_heads][head_dim]) and hashes them in one
// piece: each layer's K then V of the block's first `tokens` slots, nothing else; for 4-byte
// (float32) and 1-byte (FP8 E4M3: --kv-cache-dtype fp8) elements alike.
#include "kv_transfer/kv_checksum.h"

#include <xxhash.h>

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace pdserve::kv_transfer {
namespace {

constexpr int kLayers = 3;
constexpr int kBlockSize = 4;
constexpr int kHeads = 2;
constexpr int kHeadDim = 3;
int g_element_bytes =
    4;  // bytes per element of the pool under test (for_each_element_size sets it)

DType element_dtype() {
  return g_element_bytes == 1 ? DType::kF8E4M3 : DType::kF32;
}

KvLayout layout_of(int num_blocks) {
  return KvLayout{kLayers, num_blocks, kBlockSize, kHeads, kHeadDim, element_dtype()};
}

// Runs the test body for float32 and FP8 pools.
template <typename Body>
void for_each_element_size(Body body) {
  for (const int bytes : {4, 1}) {
    SCOPED_TRACE(std::to_string(bytes) + "-byte elements");
    g_element_bytes = bytes;
    body();
  }
  g_element_bytes = 4;
}

std::vector<std::byte> random_pool(int num_blocks, unsigned seed) {
  std::vector<std::byte> pool(static_cast<size_t>(2 * kLayers * num_blocks * kBlockSize * kHeads *
                                                  kHeadDim * g_element_bytes));
  std::mt19937 rng(seed);
  for (std::byte& b : pool) b = static_cast<std::byte>(rng() & 0xff);
  return pool;
}

// Byte offset of element (half, layer, block, slot, head, dim, byte) by hand.
size_t byte_at(int num_blocks, int half, int layer, int block, int slot, int head, int dim,
               int byte) {
  const size_t per_half =
      static_cast<size_t>(kLayers * num_blocks * kBlockSize * kHeads * kHeadDim * g_element_bytes);
  const size_t element =
      ((((static_cast<size_t>(layer) * num_blocks + block) * kBlockSize + slot) * kHeads + head) *
           kHeadDim +
       dim);
  return half * per_half + element * g_element_bytes + byte;
}

uint64_t oracle(const std::vector<std::byte>& pool, int num_blocks, int block, int tokens) {
  std::vector<std::byte> gathered;
  for (int layer = 0; layer < kLayers; ++layer) {
    for (int half = 0; half < 2; ++half) {
      for (int slot = 0; slot < tokens; ++slot) {
        for (int head = 0; head < kHeads; ++head) {
          for (int dim = 0; dim < kHeadDim; ++dim) {
            for (int byte = 0; byte < g_element_bytes; ++byte) {
              gathered.push_back(
                  pool[byte_at(num_blocks, half, layer, block, slot, head, dim, byte)]);
            }
          }
        }
      }
    }
  }
  return XXH3_64bits(gathered.data(), gathered.size());
}

TEST(KvChecksum, CoversEachLayersKThenVOfTheSlotsTheBlockHolds) {
  for_each_element_size([] {
    const std::vector<std::byte> pool = random_pool(5, 1);
    const KvLayout layout = layout_of(5);
    for (int block = 0; block < 5; ++block) {
      for (int tokens = 1; tokens <= kBlockSize; ++tokens) {
        EXPECT_EQ(block_checksum(pool.data(), layout, block, tokens),
                  oracle(pool, 5, block, tokens))
            << "block " << block << ", " << tokens << " tokens";
      }
    }
  });
}

TEST(KvChecksum, EveryCoveredByteCountsAndNoOtherDoes) {
  for_each_element_size([] {
    std::vector<std::byte> pool = random_pool(5, 2);
    const KvLayout layout = layout_of(5);
    constexpr int kBlock = 3;
    constexpr int kTokens = 2;  // a partial last block
    const uint64_t clean = block_checksum(pool.data(), layout, kBlock, kTokens);
    for (size_t at = 0; at < pool.size(); ++at) {
      // Is byte `at` one of the block's first kTokens slots, in any layer, K or V?
      bool covered = false;
      for (int half = 0; half < 2 && !covered; ++half) {
        for (int layer = 0; layer < kLayers && !covered; ++layer) {
          const size_t begin = byte_at(5, half, layer, kBlock, 0, 0, 0, 0);
          const size_t end = byte_at(5, half, layer, kBlock, kTokens, 0, 0, 0);
          covered = at >= begin && at < end;
        }
      }
      pool[at] ^= std::byte{0x01};
      const uint64_t changed = block_checksum(pool.data(), layout, kBlock, kTokens);
      pool[at] ^= std::byte{0x01};
      if (covered) {
        ASSERT_NE(changed, clean) << "byte " << at << " is covered but did not count";
      } else {
        ASSERT_EQ(changed, clean) << "byte " << at << " is not covered but counted";
      }
    }
  });
}

// Sender and receiver agree on a block copied from one pool into another block id of a pool of
// another size, whatever the unused slots hold on either side.
TEST(KvChecksum, AgreesAcrossPoolsBlockIdsAndStaleSlots) {
  const std::vector<std::byte> sender = random_pool(5, 3);
  std::vector<std::byte> receiver = random_pool(8, 4);
  const KvLayout from = layout_of(5);
  const KvLayout to = layout_of(8);
  constexpr int kTokens = 3;
  for (int layer = 0; layer < kLayers; ++layer) {
    for (bool value_half : {false, true}) {
      std::memcpy(receiver.data() + to.offset(layer, 6, value_half),
                  sender.data() + from.offset(layer, 1, value_half), kTokens * to.token_bytes());
    }
  }
  EXPECT_EQ(block_checksum(receiver.data(), to, 6, kTokens),
            block_checksum(sender.data(), from, 1, kTokens));
  EXPECT_NE(block_checksum(receiver.data(), to, 6, kTokens + 1),
            block_checksum(sender.data(), from, 1, kTokens + 1));
}

TEST(KvChecksum, APromptsBlocksAreFullExceptItsLast) {
  const std::vector<std::byte> pool = random_pool(5, 5);
  const KvLayout layout = layout_of(5);
  // A 10-token prompt: blocks 0-1 full, block 2 holds 2 tokens; block 0 is cached on the
  // receiver, so blocks 1 and 2 are sent, here in pool blocks 4 and 0.
  const std::vector<int32_t> blocks = {4, 0};
  EXPECT_EQ(prompt_block_checksums(pool.data(), layout, blocks, 1, 10),
            (std::vector<uint64_t>{oracle(pool, 5, 4, 4), oracle(pool, 5, 0, 2)}));
  // A prompt that fills its last block.
  EXPECT_EQ(prompt_block_checksums(pool.data(), layout, blocks, 1, 12),
            (std::vector<uint64_t>{oracle(pool, 5, 4, 4), oracle(pool, 5, 0, 4)}));
}

TEST(KvChecksum, ComparingFindsTheFirstDifferenceAndCountsThem) {
  const std::vector<uint64_t> sent = {1, 2, 3, 4};
  EXPECT_TRUE(compare_block_checksums(sent, sent).ok());
  const Status one = compare_block_checksums(sent, std::vector<uint64_t>{1, 2, 9, 4});
  EXPECT_EQ(one.code(), StatusCode::kDataLoss);
  EXPECT_NE(one.message().find("1 of 4"), std::string::npos) << one.message();
  EXPECT_NE(one.message().find("index 2"), std::string::npos) << one.message();
  const Status two = compare_block_checksums(sent, std::vector<uint64_t>{0, 2, 3, 0});
  EXPECT_NE(two.message().find("2 of 4"), std::string::npos) << two.message();
  EXPECT_NE(two.message().find("index 0"), std::string::npos) << two.message();
  // Missing checksums (a sender that computed none) never pass.
  EXPECT_EQ(compare_block_checksums({}, sent).code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace pdserve::kv_transfer
