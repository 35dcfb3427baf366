// Launchers of the FP8 linear layer's CUDA kernels (fp8_linear_cuda.cu): pointers, strides and
// a stream; they never allocate (the caller's workspace is planned by fp8_linear_plan.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda_kernels.h"

namespace pdserve::cuda {

// `x` (bf16 or float32 rows) -> `q` (x.rows x x.cols e4m3 codes, row stride x.cols) and
// `scales` (float[ceil(cols/128)][rows]), per fp8_activation_quant.h, bit for bit.
cudaError_t quantize_fp8_token_groups(Matrix x, uint8_t* q, float* scales, cudaStream_t stream);

// An FP8 weight's scales (row-major [ceil(n/block_n)][ceil(k/block_k)]) as cuBLASLt's
// BLK128x128 grid float[ceil(n/128)][grid_stride] (fp8_tile_scales in fp8_linear_plan.h).
cudaError_t fp8_tile_scales(const float* scales, int64_t n, int64_t k, int64_t block_n,
                            int64_t block_k, float* grid, int64_t grid_stride, cudaStream_t stream);

// out (n x k, bf16 or float32) = e4m3 weight (row stride w_stride) x its block's scale.
cudaError_t dequantize_fp8(const uint8_t* weight, int64_t w_stride, const float* scales,
                           int64_t block_n, int64_t block_k, Matrix out, cudaStream_t stream);

}  // namespace pdserve::cuda
