// Operands of one CPU linear layer (see linear_cpu.h). Kept free of other project headers so
// the instruction-set-specific kernel files can include it safely.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/core/dtype_enum.h"

namespace pdserve {

struct LinearProblem {
  const float* x = nullptr;
  int64_t x_stride = 0;
  const void* w = nullptr;
  DType w_dtype = DType::kF32;
  int64_t w_stride = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  // FP8 weights: float32 multipliers per scale_block_n x scale_block_k block of w, row-major
  // [ceil(n / scale_block_n), ceil(k / scale_block_k)] (kernels/backend.h MatrixView).
  const float* w_scale = nullptr;
  int64_t scale_block_n = 0;
  int64_t scale_block_k = 0;
};

// The bf16 kernel converts activations in chunks of this many k (a multiple of 32); when k is
// longer it keeps each column's accumulators between chunks, for at most
// kMaxLinearColumnBlock columns per call.
constexpr int64_t kLinearActivationChunk = 4096;
constexpr int64_t kMaxLinearColumnBlock = 384;

// The most activation rows one tile of the vector kernels computes at once.
constexpr int kLinearRowTile = 4;

// Calls tile(std::integral_constant<int, ROWS>{}, first_row) for the row tiles of an m-row
// problem: kLinearRowTile rows at a time, then one tile of the 1-3 rows left.
template <typename RowTile>
inline void for_each_row_tile(int64_t m, RowTile&& tile) {
  static_assert(kLinearRowTile == 4, "the remainder below covers 1-3 rows");
  int64_t i = 0;
  for (; i + kLinearRowTile <= m; i += kLinearRowTile) {
    tile(std::integral_constant<int, kLinearRowTile>{}, i);
  }
  switch (m - i) {
    case 3:
      tile(std::integral_constant<int, 3>{}, i);
      break;
    case 2:
      tile(std::integral_constant<int, 2>{}, i);
      break;
    case 1:
      tile(std::integral_constant<int, 1>{}, i);
      break;
    default:
      break;
  }
}

// Calls fn(std::integral_constant<DType, W>{}) for the weight element type W.
template <typename Fn>
inline void with_weight_dtype(DType w_dtype, Fn&& fn) {
  switch (w_dtype) {
    case DType::kBF16:
      fn(std::integral_constant<DType, DType::kBF16>{});
      break;
    case DType::kF16:
      fn(std::integral_constant<DType, DType::kF16>{});
      break;
    case DType::kF32:
      fn(std::integral_constant<DType, DType::kF32>{});
      break;
    case DType::kF8E4M3:  // the linear_cpu_fp8_* kernels take FP8 weights
      break;
  }
}

// Each computes output columns [n_begin, n_end) for all rows on the calling thread, at one
// instruction-set level (kernels/cpu_isa.h); only call them when the CPU has that level.
void linear_cpu_columns_avx2(const LinearProblem& problem, int64_t n_begin, int64_t n_end);
void linear_cpu_columns_avx512(const LinearProblem& problem, int64_t n_begin, int64_t n_end);
// bf16 weights only.
void linear_cpu_columns_avx512_bf16(const LinearProblem& problem, int64_t n_begin, int64_t n_end);

// FP8 E4M3 weights (w_dtype kF8E4M3 with w_scale): portable and avx2 (the same order, bitwise):
// for every k block of scale_block_k, eight interleaved fused multiply-add partial sums over
// its multiple-of-8 part and one serial sum over the rest; the block's scale then multiplies
// each partial sum into eight running sums (fma) and the rest into a running tail; finally the
// portable pairwise combine of the eight plus the tail. avx512_bf16: the activations rounded
// to bf16, the codes as bf16 times 2^-8 (exact), vdpbf16ps over 64 k at a time within each
// block (the even k, then the odd k; the block's tail zero-padded), the block's partial sums
// times 2^8 times its scale added into sixteen running lanes (fma), summed with sum_lanes16's
// tree. The avx512 level (no bf16 dot products) runs the avx2 kernel.
//
// Below kFp8DecodeOnceMinRows activation rows (small decode batches: bound by reading the
// weights) the avx2 and avx512_bf16 kernels widen the codes in registers for every row tile,
// reading one byte a weight from memory; from it on (decode batches of 8 or more and prefill
// chunks: bound by the widening, which the in-register path pays again for every 4-row tile)
// each call widens its column block once, exactly, into the caller's per-thread `decoded`
// buffer (L2 sized: linear_cpu's column blocks count its bytes; at avx512_bf16 the first row
// tile writes it as it goes) and every other row tile reads that. The block scales stay applied to the partial sums in both, so every element's
// sum is the same, bit for bit, whatever the batch.
constexpr int64_t kFp8DecodeOnceMinRows = 8;
// How far ahead of their loads the kernels that stream FP8 codes from memory fetch them into L1.
// The hardware prefetchers alone left the widening and the reads taking turns: 13 GB/s of codes
// from DRAM on two threads at avx512_bf16, 22-27 GB/s with this (bf16 weights stream at 24;
// pdserve-bench-linear -n 131072 -k 4096 --rows 1, distances of 1.5-3 KiB about equal).
constexpr int64_t kFp8PrefetchAhead = 2048;
void linear_cpu_fp8_columns_portable(const LinearProblem& problem, int64_t n_begin,
                                     int64_t n_end);
// `decoded`: (n_end - n_begin) * fp8_decoded_row_avx2(k) floats when m >= kFp8DecodeOnceMinRows
// (else unused).
void linear_cpu_fp8_columns_avx2(const LinearProblem& problem, int64_t n_begin, int64_t n_end,
                                 float* decoded);
constexpr int64_t fp8_decoded_row_avx2(int64_t k) {
  return (k + 7) / 8 * 8;
}
// The avx512_bf16 FP8 kernel's layout of a row of k (activations, and widened weights): each
// scale block zero-padded to a multiple of 64 positions, and every 64 of them as the 32 even
// ones followed by the 32 odd ones (the order its widening of a 64-byte load gives).
constexpr int64_t fp8_block_stride(int64_t k, int64_t block_k) {
  return ((k < block_k ? k : block_k) + 63) / 64 * 64;
}
constexpr int64_t fp8_activation_row(int64_t k, int64_t block_k) {
  return (k + block_k - 1) / block_k * fp8_block_stride(k, block_k);
}
// `scratch`: kLinearRowTile * fp8_activation_row(k, scale_block_k) elements for the bf16
// activations; `decoded`: (n_end - n_begin) * fp8_activation_row(k, scale_block_k) bf16 when
// m >= kFp8DecodeOnceMinRows (else unused).
void linear_cpu_fp8_columns_avx512_bf16(const LinearProblem& problem, int64_t n_begin,
                                        int64_t n_end, uint16_t* scratch, uint16_t* decoded);
// The bf16 bits of the E4M3 magnitudes 0..127 (code & 0x7F; 0x7F is NaN) times 2^-8, exact,
// for the avx512_bf16 kernel's lookups.
const uint16_t* fp8_e4m3_magnitudes_bf16_scaled();

}  // namespace pdserve
