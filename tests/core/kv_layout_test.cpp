// KvLayout is the one description of a KV pool that the kernels (element indices: kv_slot,
// kv_element) and the transfer layer (byte offsets of a layer's block) both use. The oracle is
// the pool's definition itself: K then V, each a row-major
// [layers][blocks][block_size][kv_heads][head_dim] array, enumerated here by nested loops in
// that order, so that the n-th element visited is element n of the pool.
#include "common/core/kv_layout.h"

#include <gtest/gtest.h>

#include <vector>

namespace pdserve {
namespace {

TEST(KvLayout, EveryLayersBlockHalfIsItsOwnRangeAndTheyTileThePool) {
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF8E4M3}) {
    const KvLayout layout{3, 5, 4, 2, 8, dtype};
    const std::size_t element_bytes = dtype == DType::kF32      ? 4
                                      : dtype == DType::kF8E4M3 ? 1
                                                                : 2;  // the dtypes' definitions
    ASSERT_EQ(layout.total_bytes(), 2u * 3 * 5 * 4 * 2 * 8 * element_bytes);
    ASSERT_EQ(kv_element_bytes(layout), static_cast<int64_t>(element_bytes));
    std::vector<int> owners(layout.total_bytes(), 0);
    for (int layer = 0; layer < layout.num_layers; ++layer) {
      for (int block = 0; block < layout.num_blocks; ++block) {
        for (const bool value_half : {false, true}) {
          const std::uint64_t begin = layout.offset(layer, block, value_half);
          ASSERT_LE(begin + layout.layer_block_bytes(), layout.total_bytes());
          for (std::uint64_t b = begin; b < begin + layout.layer_block_bytes(); ++b) ++owners[b];
        }
      }
    }
    for (std::size_t b = 0; b < owners.size(); ++b) ASSERT_EQ(owners[b], 1) << "byte " << b;
    EXPECT_EQ(layout.offset(0, 0, true), layout.total_bytes() / 2) << "V follows all of K";
  }
}

TEST(KvLayout, IndicesAndByteOffsetsAreThoseOfTheRowMajorPool) {
  for (const DType dtype : {DType::kBF16, DType::kF8E4M3}) {
    // Every extent distinct and above 1, so that a swapped pair of dimensions shows.
    const KvLayout layout{3, 5, 4, 2, 6, dtype};
    const auto half_elements =
        static_cast<int64_t>(layout.total_bytes() / 2 / layout.element_bytes());
    int64_t n = 0;  // the row-major index of the element the loops are at
    for (const bool value_half : {false, true}) {
      for (int layer = 0; layer < layout.num_layers; ++layer) {
        for (int block = 0; block < layout.num_blocks; ++block) {
          for (int in_block = 0; in_block < layout.block_size; ++in_block) {
            const int64_t slot = kv_slot(layout, block, in_block);
            for (int head = 0; head < layout.num_kv_heads; ++head) {
              for (int dim = 0; dim < layout.head_dim; ++dim, ++n) {
                const int64_t in_half = n - (value_half ? half_elements : 0);
                ASSERT_EQ(kv_element(layout, layer, slot, head, dim), in_half)
                    << "layer " << layer << " block " << block << " token " << in_block << " head "
                    << head << " dim " << dim;
                if (in_block == 0 && head == 0 && dim == 0) {
                  ASSERT_EQ(layout.offset(layer, block, value_half),
                            static_cast<std::uint64_t>(n) * layout.element_bytes());
                }
              }
            }
          }
        }
      }
    }
    EXPECT_EQ(n, 2 * half_elements) << "the loops visited the whole pool";
    EXPECT_EQ(kv_element(layout, 1, 0), layout.layer_elements()) << "a layer's extent";
    EXPECT_EQ(kv_element(layout, 0, 1), layout.token_elements()) << "a slot's extent";
  }
}

}  // namespace
}  // namespace pdserve
