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

std::uint64_t bytes_checksum(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
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

struct BlockChecksumStream::BlockState {
  std::unique_ptr<XXH3_state_t, StateDeleter> state;
  std::size_t bytes = 0;  // of each half, the prompt's tokens in this block
  int next_half = 0;      // 2 * layer + (V ? 1 : 0) of the next half expected
};

BlockChecksumStream::BlockChecksumStream(const KvLayout& layout, std::span<const int32_t> blocks,
                                         int first_block, int num_prompt_tokens)
    : layout_(layout) {
  const int block_size = layout.block_size;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const int begin = (first_block + static_cast<int>(i)) * block_size;
    auto block = std::make_unique<BlockState>();
    block->state.reset(XXH3_createState());
    PDS_CHECK(block->state != nullptr, "BlockChecksumStream: out of memory");
    XXH3_64bits_reset(block->state.get());
    block->bytes = static_cast<std::size_t>(std::min(block_size, num_prompt_tokens - begin)) *
                   layout.token_bytes();
    index_.emplace(blocks[i], states_.size());
    states_.push_back(std::move(block));
  }
}

BlockChecksumStream::~BlockChecksumStream() = default;

Status BlockChecksumStream::add(std::uint64_t pool_offset, const std::byte* data,
                                std::uint64_t bytes) {
  const std::uint64_t unit = layout_.layer_block_bytes();
  const std::uint64_t half_bytes = layout_.offset(0, 0, true);
  if (unit == 0 || pool_offset % unit != 0 || bytes % unit != 0 || bytes == 0 ||
      pool_offset >= 2 * half_bytes || bytes > 2 * half_bytes - pool_offset) {
    return failed_precondition("KV checksum stream: " + std::to_string(bytes) +
                               " bytes at pool offset " + std::to_string(pool_offset) +
                               " are not whole layer-block halves of the pool");
  }
  const auto blocks = static_cast<std::uint64_t>(layout_.num_blocks);
  for (std::uint64_t done = 0; done < bytes; done += unit) {
    const std::uint64_t offset = pool_offset + done;
    const bool value_half = offset >= half_bytes;
    const std::uint64_t index = (value_half ? offset - half_bytes : offset) / unit;
    const int layer = static_cast<int>(index / blocks);
    const auto block = static_cast<int32_t>(index % blocks);
    auto it = index_.find(block);
    if (it == index_.end()) {
      return failed_precondition("KV checksum stream: block " + std::to_string(block) +
                                 " is not one of the prompt's");
    }
    BlockState& state = *states_[it->second];
    const int half = 2 * layer + (value_half ? 1 : 0);
    if (half != state.next_half) {
      return failed_precondition("KV checksum stream: block " + std::to_string(block) +
                                 " got layer " + std::to_string(layer) +
                                 (value_half ? " V" : " K") + " out of order");
    }
    XXH3_64bits_update(state.state.get(), data + done, state.bytes);
    ++state.next_half;
  }
  return Status::ok_status();
}

Result<std::vector<std::uint64_t>> BlockChecksumStream::finish() {
  std::vector<std::uint64_t> sums;
  sums.reserve(states_.size());
  for (const auto& state : states_) {
    if (state->next_half != 2 * layout_.num_layers) {
      return failed_precondition("KV checksum stream: a block got " +
                                 std::to_string(state->next_half) + " of its " +
                                 std::to_string(2 * layout_.num_layers) + " layer halves");
    }
    sums.push_back(XXH3_64bits_digest(state->state.get()));
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
