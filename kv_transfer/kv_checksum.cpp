#include "kv_transfer/kv_checksum.h"

#include <xxhash.h>

#include <algorithm>
#include <memory>
#include <string>

namespace pdserve::kv_transfer {
namespace {

struct StateDeleter {
  void operator()(XXH3_state_t* state) const { XXH3_freeState(state); }
};

}  // namespace

std::uint64_t block_checksum(const std::byte* pool, const KvLayout& layout, int32_t block,
                             int tokens) {
  PDS_CHECK(tokens >= 1 && tokens <= layout.block_size && block >= 0 &&
                block < layout.num_blocks,
            "block_checksum: block " + std::to_string(block) + " with " + std::to_string(tokens) +
                " tokens is outside the pool");
  std::unique_ptr<XXH3_state_t, StateDeleter> state(XXH3_createState());
  PDS_CHECK(state != nullptr, "block_checksum: out of memory");
  XXH3_64bits_reset(state.get());
  const std::size_t bytes = static_cast<std::size_t>(tokens) * layout.token_bytes();
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    for (bool value_half : {false, true}) {
      XXH3_64bits_update(state.get(), pool + layout.offset(layer, block, value_half), bytes);
    }
  }
  return XXH3_64bits_digest(state.get());
}

std::vector<std::uint64_t> prompt_block_checksums(const std::byte* pool, const KvLayout& layout,
                                                  std::span<const int32_t> blocks, int first_block,
                                                  int num_prompt_tokens) {
  const int block_size = layout.block_size;
  std::vector<std::uint64_t> sums;
  sums.reserve(blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const int begin = (first_block + static_cast<int>(i)) * block_size;
    sums.push_back(
        block_checksum(pool, layout, blocks[i], std::min(block_size, num_prompt_tokens - begin)));
  }
  return sums;
}

Status compare_block_checksums(std::span<const std::uint64_t> sent,
                               std::span<const std::uint64_t> landed) {
  if (sent.size() != landed.size()) {
    return data_loss("KV checksums: the sender gave " + std::to_string(sent.size()) +
                     " for a transfer of " + std::to_string(landed.size()) + " blocks");
  }
  std::size_t first = sent.size();
  std::size_t differing = 0;
  for (std::size_t i = 0; i < sent.size(); ++i) {
    if (sent[i] == landed[i]) continue;
    if (differing++ == 0) first = i;
  }
  if (differing == 0) return Status::ok_status();
  return data_loss("KV checksum mismatch: " + std::to_string(differing) + " of " +
                   std::to_string(sent.size()) + " transferred blocks differ, the first at index " +
                   std::to_string(first));
}

}  // namespace pdserve::kv_transfer
