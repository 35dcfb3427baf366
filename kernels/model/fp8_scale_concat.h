// The scales of FP8 weights concatenated by rows (q/k/v and gate/up become one matrix each on
// a device, so each is one GEMM) as one scale grid over the whole matrix, in the layout of
// kernels/backend.h's MatrixView: row-major [ceil(rows/block_n)][ceil(cols/block_k)].
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/core/status.h"

namespace pdserve {

struct Fp8ScalePart {
  int64_t rows = 0;
  int64_t cols = 0;
  const float* scales = nullptr;
  int64_t block_n = 0;
  int64_t block_k = 0;
};

struct Fp8ScaleGrid {
  std::vector<float> scales;
  int64_t block_n = 0;
  int64_t block_k = 0;
};

// Parts sharing a block shape whose row counts (all but the last) are multiples of block_n
// keep it (Qwen's 128x128 blocks: the grids stack); otherwise each row gets its own scales
// (block_n 1), which holds any mix of per-tensor, per-channel and block scales. Unimplemented
// when the parts' block_k differ; InvalidArgument for mismatched widths or a missing scale.
Result<Fp8ScaleGrid> concatenate_fp8_scales(std::span<const Fp8ScalePart> parts);

}  // namespace pdserve
