#include "kernels/model/fp8_scale_concat.h"

#include <string>

namespace pdserve {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

Result<Fp8ScaleGrid> concatenate_fp8_scales(std::span<const Fp8ScalePart> parts) {
  if (parts.empty()) return invalid_argument("no FP8 weights to concatenate");
  const Fp8ScalePart& first = parts.front();
  bool blocks_stack = true;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Fp8ScalePart& part = parts[i];
    if (part.scales == nullptr || part.block_n <= 0 || part.block_k <= 0) {
      return invalid_argument("an FP8 weight without its scales");
    }
    if (part.cols != first.cols) {
      return invalid_argument("cannot concatenate FP8 weights of different widths");
    }
    if (part.block_k != first.block_k) {
      return unimplemented("cannot concatenate FP8 weights with scale blocks " +
                           std::to_string(first.block_k) + " and " + std::to_string(part.block_k) +
                           " columns wide");
    }
    const bool last = i + 1 == parts.size();
    blocks_stack =
        blocks_stack && part.block_n == first.block_n && (last || part.rows % part.block_n == 0);
  }
  Fp8ScaleGrid grid;
  grid.block_k = first.block_k;
  grid.block_n = blocks_stack ? first.block_n : 1;
  const int64_t scale_cols = ceil_div(first.cols, first.block_k);
  for (const Fp8ScalePart& part : parts) {
    if (blocks_stack) {
      grid.scales.insert(grid.scales.end(), part.scales,
                         part.scales + ceil_div(part.rows, part.block_n) * scale_cols);
      continue;
    }
    for (int64_t row = 0; row < part.rows; ++row) {
      const float* block_row = part.scales + (row / part.block_n) * scale_cols;
      grid.scales.insert(grid.scales.end(), block_row, block_row + scale_cols);
    }
  }
  return grid;
}

}  // namespace pdserve
