// KvLayout is the one description of a KV pool that the kernels (element arithmetic:
// layer * layer_elements + slot * token_elements) and the transfer layer (byte offsets of a
// layer's block) both use. Properties that must hold: the (layer, block, K/V) ranges tile the
// pool exactly, once each, and the two arithmetics name the same bytes.
#include "common/core/kv_layout.h"

#include <gtest/gtest.h>

#include <vector>

namespace pdserve {
namespace {

TEST(KvLayout, EveryLayersBlockHalfIsItsOwnRangeAndTheyTileThePool) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    const KvLayout layout{3, 5, 4, 2, 8, dtype};
    ASSERT_EQ(layout.total_bytes(), 2u * 3 * 5 * 4 * 2 * 8 * (dtype == DType::kF32 ? 4 : 2));
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

TEST(KvLayout, TheKernelsElementIndexAndTheTransfersByteOffsetNameTheSameBytes) {
  const KvLayout layout{2, 7, 16, 4, 64, DType::kBF16};
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    for (int block : {0, 3, 6}) {
      for (int in_block : {0, 9, 15}) {
        const int64_t slot = static_cast<int64_t>(block) * layout.block_size + in_block;
        const int64_t element = layer * layout.layer_elements() + slot * layout.token_elements();
        EXPECT_EQ(static_cast<std::uint64_t>(element) * layout.element_bytes(),
                  layout.offset(layer, block, false) +
                      static_cast<std::uint64_t>(in_block) * layout.token_bytes());
      }
    }
  }
  EXPECT_EQ(layout.bytes_per_block() * static_cast<std::size_t>(layout.num_blocks),
            layout.total_bytes());
}

}  // namespace
}  // namespace pdserve
