// A node's KV pool as the transfer layer sees it (kernels/model/kv_cache.h: one allocation, K
// then V, each [layers][blocks][block_size][kv_heads][head_dim]): where the bytes of a (layer,
// block) lie, on this node or on a peer with the same block geometry and another pool size.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/protocol/prefill_protocol.h"

namespace pdserve::kv_transfer {

struct PoolLayout {
  KvBlockLayout block;
  int num_blocks = 0;
  std::size_t element_bytes = 0;

  // Bytes of one token slot of one layer's K (or V).
  std::size_t token_bytes() const;
  std::size_t layer_block_bytes() const;
  // Byte offset of (layer, block) in the K (value_half false) or V half.
  std::uint64_t offset(int layer, int block, bool value_half) const;
};

}  // namespace pdserve::kv_transfer
