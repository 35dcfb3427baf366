// Integrity of transferred KV blocks (issue #15): the prefill node checksums each block it
// sends, the decode node checksums the block as it landed in its own pool and compares before
// the sequence may read it. A block's checksum is XXH3-64 (libxxhash) over exactly the bytes a
// sequence reads from it: for each layer in order, the K bytes of the block's first `tokens`
// slots, then the V bytes of the same slots. The slots after the prompt's last token in its
// last block are left out (they hold stale data on both sides and are written by the decode
// steps), so sender and receiver agree whatever those bytes are, and block ids and pool sizes
// may differ between the two sides.
//
// Host memory only. A GPU pool on the staging path (issue #14) is checksummed from its host
// copies: the sender's bounce buffers as they stream past (BlockChecksumStream), the
// receiver's landing area once it has landed. A GPU pool on the zero-copy path has none
// (ucx_kv_connector.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/core/status.h"
#include "common/core/kv_layout.h"

namespace pdserve::kv_transfer {

// The checksum of `block` in the pool at `pool` (layout.num_blocks blocks), over its first
// `tokens` slots (1..block_size).
std::uint64_t block_checksum(const std::byte* pool, const KvLayout& layout, int32_t block,
                             int tokens);

// XXH3-64 of contiguous bytes: a block's copy in a lower KV tier (kv_tiers/), whose layout is
// the tier's own.
std::uint64_t bytes_checksum(std::span<const std::byte> bytes);

// One checksum per prompt block first_block.. of a prompt of `num_prompt_tokens` tokens, whose
// blocks here are `blocks` (blocks[i] holds prompt block first_block + i; the last one may be
// partial).
std::vector<std::uint64_t> prompt_block_checksums(const std::byte* pool, const KvLayout& layout,
                                                  std::span<const int32_t> blocks, int first_block,
                                                  int num_prompt_tokens);

// prompt_block_checksums of a pool that is never whole in host memory: the bytes of each
// block's (layer, K/V half) are added as they pass through a staging buffer, whole
// layer-block halves at a time, each block's halves in the order block_checksum reads them
// (layer 0 K, layer 0 V, layer 1 K, ...; the export sends every layer's K runs, then its V
// runs, layer after layer). Not thread-safe.
class BlockChecksumStream {
 public:
  // As prompt_block_checksums(pool, layout, blocks, first_block, num_prompt_tokens).
  BlockChecksumStream(const KvLayout& layout, std::span<const int32_t> blocks, int first_block,
                      int num_prompt_tokens);
  ~BlockChecksumStream();
  BlockChecksumStream(const BlockChecksumStream&) = delete;
  BlockChecksumStream& operator=(const BlockChecksumStream&) = delete;

  // `bytes` of the pool at `pool_offset`, seen at `data`: whole layer-block halves of blocks
  // of this prompt. FailedPrecondition for a range that is not, or a half out of order.
  Status add(std::uint64_t pool_offset, const std::byte* data, std::uint64_t bytes);
  // One checksum per block; FailedPrecondition unless every half of every block was added.
  Result<std::vector<std::uint64_t>> finish();

 private:
  struct BlockState;
  KvLayout layout_;
  std::unordered_map<int32_t, std::size_t> index_;  // block id -> position
  std::vector<std::unique_ptr<BlockState>> states_;
};

// OK when `landed` equals `sent`; DataLoss naming the first block that differs and how many
// do, or saying that the counts differ.
Status compare_block_checksums(std::span<const std::uint64_t> sent,
                               std::span<const std::uint64_t> landed);

}  // namespace pdserve::kv_transfer
