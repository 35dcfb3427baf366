// The content key of a full KV block in the prefix cache: a chained 64-bit hash of the
// parent block's key and the block's token ids, so equal keys mean (barring a collision) equal
// prefixes. The key is portable across nodes; the block manager never trusts it alone.
#pragma once

#include <cstdint>
#include <span>

namespace pdserve {

// The parent key of a sequence's first block.
inline constexpr uint64_t kRootBlockHash = 0x6a09e667f3bcc908ULL;

using BlockHashFn = uint64_t (*)(uint64_t parent_hash, std::span<const int32_t> tokens);

// Murmur3-finalizer chain over the tokens (each step a bijection of the state, so two blocks
// that differ in one token under the same parent always get different keys), closed with the
// block length.
uint64_t hash_block_tokens(uint64_t parent_hash, std::span<const int32_t> tokens);

}  // namespace pdserve
