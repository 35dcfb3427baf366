// Block quantization of float weights to FP8 E4M3 as Qwen's "-FP8" exports store them: one
// scale per block_n x block_k block, scale = amax(|block|) / 448 rounded to the dtype the
// checkpoint stores scales in, code = the block's values / scale rounded to nearest even and
// clamped to +-448. The stored scale multiplies the codes back (weight_scale_inv).
#pragma once

#include <cstdint>

#include "common/core/dtype.h"

namespace pdserve {

// Quantizes one row stripe: `values` holds rows x k floats (rows <= the block height, so every
// column block of the stripe is one scale block); writes rows x k codes and ceil(k / block_k)
// scales (representable in `scale_dtype`). An all-zero block gets scale 0 and zero codes.
void quantize_fp8_stripe(const float* values, int64_t rows, int64_t k, int64_t block_k,
                         DType scale_dtype, uint8_t* codes, float* scales);

}  // namespace pdserve
