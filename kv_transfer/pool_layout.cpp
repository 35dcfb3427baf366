#include "kv_transfer/pool_layout.h"

namespace pdserve::kv_transfer {

std::size_t PoolLayout::token_bytes() const {
  return static_cast<std::size_t>(block.num_kv_heads) * static_cast<std::size_t>(block.head_dim) *
         element_bytes;
}

std::size_t PoolLayout::layer_block_bytes() const {
  return static_cast<std::size_t>(block.block_size) * token_bytes();
}

std::uint64_t PoolLayout::offset(int layer, int block_id, bool value_half) const {
  const std::uint64_t per_half = static_cast<std::uint64_t>(block.num_layers) *
                                 static_cast<std::uint64_t>(num_blocks) * layer_block_bytes();
  return (value_half ? per_half : 0) +
         (static_cast<std::uint64_t>(layer) * static_cast<std::uint64_t>(num_blocks) +
          static_cast<std::uint64_t>(block_id)) *
             layer_block_bytes();
}

}  // namespace pdserve::kv_transfer
