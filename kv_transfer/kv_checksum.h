// Integrity of transferred KV blocks (issue #15): the prefill node checksums each block it
// sends, the decode node checksums the block as it landed in its own pool and compares before
// the sequence may read it. A block's checksum is XXH3-64 (libxxhash) over exactly the bytes a
// sequence reads from it: for each layer in order, the K bytes of the block's first `tokens`
// slots, then the V bytes of the same slots. The slots after the prompt's last token in its
// last block are left out (they hold stale data on both sides and are written by the decode
// steps), so sender and receiver agree whatever those bytes are, and block ids and pool sizes
// may differ between the two sides.
//
// Host memory only: a CUDA pool would need a device kernel or a host copy (issue #14); the
// connector neither computes nor verifies checksums for one (ucx_kv_connector.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/core/status.h"
#include "common/core/kv_layout.h"

namespace pdserve::kv_transfer {

// The checksum of `block` in the pool at `pool` (layout.num_blocks blocks), over its first
// `tokens` slots (1..block_size).
std::uint64_t block_checksum(const std::byte* pool, const KvLayout& layout, int32_t block,
                             int tokens);

// One checksum per prompt block first_block.. of a prompt of `num_prompt_tokens` tokens, whose
// blocks here are `blocks` (blocks[i] holds prompt block first_block + i; the last one may be
// partial).
std::vector<std::uint64_t> prompt_block_checksums(const std::byte* pool, const KvLayout& layout,
                                                  std::span<const int32_t> blocks, int first_block,
                                                  int num_prompt_tokens);

// OK when `landed` equals `sent`; DataLoss naming the first block that differs and how many
// do, or saying that the counts differ.
Status compare_block_checksums(std::span<const std::uint64_t> sent,
                               std::span<const std::uint64_t> landed);

}  // namespace pdserve::kv_transfer
