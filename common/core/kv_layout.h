// The one description of a node's paged KV pool: a single allocation holding K then V, each
// [layers][blocks][block_size][kv_heads][head_dim] of `dtype`. A token's KV lives at slot =
// block * block_size + offset in its block (kv_slot). The CPU and CUDA pools and their kernels
// (kernels/: element indices, kv_element), and the transfer layer (kv_transfer/: the bytes of a
// (layer, block) here or in a peer's pool of another size) all read this one type. The element
// type is float32, bfloat16 or FP8 E4M3 (1 byte: --kv-cache-dtype fp8; its per-layer scales live
// beside the pool, in KvCacheView, not here). Header-only
// C++17 with host/device qualifiers, because CUDA device code (C++17) takes it too.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/core/dtype_enum.h"

#if defined(__CUDACC__)
#define PDS_HOST_DEVICE __host__ __device__
#else
#define PDS_HOST_DEVICE
#endif

namespace pdserve {

struct KvLayout {
  int num_layers = 0;
  int num_blocks = 0;
  int block_size = 16;
  int num_kv_heads = 0;
  int head_dim = 0;
  DType dtype = DType::kF32;

  // Elements of one token's K (or V) in one layer.
  PDS_HOST_DEVICE int64_t token_elements() const {
    return static_cast<int64_t>(num_kv_heads) * head_dim;
  }
  // Elements of one layer's K (or V) across the pool.
  PDS_HOST_DEVICE int64_t layer_elements() const {
    return static_cast<int64_t>(num_blocks) * block_size * token_elements();
  }
  PDS_HOST_DEVICE std::size_t element_bytes() const {
    return dtype == DType::kF32 ? 4 : dtype == DType::kF8E4M3 ? 1 : 2;
  }

  // One token's K (or V) in one layer; one layer's K (or V) of one block.
  std::size_t token_bytes() const {
    return static_cast<std::size_t>(token_elements()) * element_bytes();
  }
  std::size_t layer_block_bytes() const {
    return static_cast<std::size_t>(block_size) * token_bytes();
  }
  // K and V of one token (or block) across all layers.
  std::size_t bytes_per_token() const {
    return 2 * static_cast<std::size_t>(num_layers) * token_bytes();
  }
  std::size_t bytes_per_block() const {
    return bytes_per_token() * static_cast<std::size_t>(block_size);
  }
  std::size_t total_bytes() const {
    return bytes_per_block() * static_cast<std::size_t>(num_blocks);
  }
  // Byte offset of (layer, block)'s K (value_half false) or V from the pool's start.
  std::uint64_t offset(int layer, int block, bool value_half) const {
    const std::uint64_t per_half = static_cast<std::uint64_t>(num_layers) *
                                   static_cast<std::uint64_t>(num_blocks) * layer_block_bytes();
    return (value_half ? per_half : 0) +
           (static_cast<std::uint64_t>(layer) * static_cast<std::uint64_t>(num_blocks) +
            static_cast<std::uint64_t>(block)) *
               layer_block_bytes();
  }
};

// The pool's index arithmetic, for host and device code. Free functions with internal linkage
// (static): the kernels compiled for another instruction set (kernels/*_avx512*.cpp) call them
// too, and an inline function with external linkage would be one definition shared with the
// rest of the program, which the linker may take from the AVX-512 object.

// The slot of the token at `offset` in pool block `block`.
static PDS_HOST_DEVICE constexpr int64_t kv_slot(const KvLayout& layout, int block, int offset) {
  return static_cast<int64_t>(block) * layout.block_size + offset;
}

// Bytes of one element (KvLayout::element_bytes, as a static function for the kernel files).
static PDS_HOST_DEVICE constexpr int64_t kv_element_bytes(const KvLayout& layout) {
  return layout.dtype == DType::kF32 ? 4 : layout.dtype == DType::kF8E4M3 ? 1 : 2;
}

// Index of element `dim` of KV head `kv_head` of the token in `slot` of `layer`, from the start
// of the pool's K (or V) half: the half is row-major [layers][slots][kv_heads][head_dim], with
// num_blocks * block_size slots.
static PDS_HOST_DEVICE constexpr int64_t kv_element(const KvLayout& layout, int layer, int64_t slot,
                                                    int kv_head = 0, int dim = 0) {
  const int64_t slots = static_cast<int64_t>(layout.num_blocks) * layout.block_size;
  return ((layer * slots + slot) * layout.num_kv_heads + kv_head) * layout.head_dim + dim;
}

}  // namespace pdserve
