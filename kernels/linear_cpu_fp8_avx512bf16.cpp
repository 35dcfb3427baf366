// The avx512_bf16 level of linear_cpu for FP8 (E4M3) weights: 32 codes at a time become bf16
// (exact: E4M3 fits bf16's exponent and mantissa, subnormals included) by two 64-entry
// vpermt2w table lookups on the magnitude and the sign bit, then meet the bf16-rounded
// activations in vdpbf16ps. Each k block's partial sums are multiplied by its scale into the
// running lanes (order: linear_problem.h). Compiled with the AVX-512 and AVX512_BF16 flags
// and only entered after the run-time CPU check.
//
// Two weight sources feed the same tile: a few rows (decode) look the codes up for every row
// tile, reading 1 byte a weight; from kFp8DecodeOnceMinRows rows on (prefill) the column block
// is looked up once into the caller's bf16 buffer and every row tile loads that, so the
// lookups no longer outnumber the dot products. Same bf16 values, same sums, bit for bit.
#include "kernels/avx512_common.h"
#include "kernels/linear_problem.h"

namespace pdserve {
namespace {

// The E4M3 magnitudes 0..127 as bf16, in four registers of 32.
struct DecodeTable {
  __m512i quarter[4];
  explicit DecodeTable(const uint16_t* magnitudes) {
    for (int q = 0; q < 4; ++q) quarter[q] = _mm512_loadu_si512(magnitudes + 32 * q);
  }
};

inline __m512bh decode32(__m256i codes, const DecodeTable& table) {
  const __m512i wide = _mm512_cvtepu8_epi16(codes);
  // Index bits 0-5 pick one of 64 words of a register pair; bit 6 picks the pair.
  const __m512i low = _mm512_permutex2var_epi16(table.quarter[0], wide, table.quarter[1]);
  const __m512i high = _mm512_permutex2var_epi16(table.quarter[2], wide, table.quarter[3]);
  const __mmask32 upper = _mm512_test_epi16_mask(wide, _mm512_set1_epi16(0x40));
  const __m512i magnitude = _mm512_mask_mov_epi16(low, upper, high);
  const __m512i sign = _mm512_slli_epi16(_mm512_and_si512(wide, _mm512_set1_epi16(0x80)), 8);
  return (__m512bh)_mm512_or_si512(magnitude, sign);
}

// x[0, count) as bf16 into out, zero-padded to a multiple of 32.
inline void convert_row(const float* x, int64_t count, uint16_t* out) {
  const int64_t padded = (count + 31) / 32 * 32;
  for (int64_t i = 0; i < padded; i += 16) {
    const __mmask16 mask = first_lanes16(count > i ? count - i : 0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        to_bf16x16(_mm512_maskz_loadu_ps(mask, x + i)));
  }
}

// The weights as codes, looked up at every use.
struct CodeWeights {
  const uint8_t* w;
  int64_t stride;
  const DecodeTable& table;
  __m512bh load32(int64_t column, int64_t kk, __mmask32 mask) const {
    return decode32(_mm256_maskz_loadu_epi8(mask, w + column * stride + kk), table);
  }
};

// The weights of columns [first_column, ...) as bf16, looked up once (row stride
// fp8_activation_row(k), zero-padded).
struct DecodedWeights {
  const uint16_t* w;
  int64_t stride;
  int64_t first_column;
  __m512bh load32(int64_t column, int64_t kk, __mmask32 mask) const {
    return (__m512bh)_mm512_maskz_loadu_epi16(mask, w + (column - first_column) * stride + kk);
  }
};

template <int MR, int NR, typename Weights>
inline void tile(const LinearProblem& p, const Weights& weights, const uint16_t* xb, int64_t x_row,
                 int64_t i0, int64_t j0) {
  const int64_t block_k = p.scale_block_k;
  const int64_t scale_cols = (p.k + block_k - 1) / block_k;
  const float* scales[NR];
#pragma GCC unroll 32
  for (int j = 0; j < NR; ++j) scales[j] = p.w_scale + ((j0 + j) / p.scale_block_n) * scale_cols;
  __m512 acc[MR][NR];
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  for (int64_t b0 = 0, b = 0; b0 < p.k; b0 += block_k, ++b) {
    const int64_t len = p.k - b0 < block_k ? p.k - b0 : block_k;
    __m512 part[MR][NR];
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 32
      for (int j = 0; j < NR; ++j) part[i][j] = _mm512_setzero_ps();
    }
    // Whole steps with every lane loaded, then the block's tail masked to zero.
    const auto step = [&](int64_t kk, __mmask32 mask) {
      __m512bh wv[NR];
#pragma GCC unroll 32
      for (int j = 0; j < NR; ++j) wv[j] = weights.load32(j0 + j, b0 + kk, mask);
#pragma GCC unroll 32
      for (int i = 0; i < MR; ++i) {
        const __m512bh x = (__m512bh)_mm512_maskz_loadu_epi16(mask, xb + i * x_row + b0 + kk);
#pragma GCC unroll 32
        for (int j = 0; j < NR; ++j) part[i][j] = _mm512_dpbf16_ps(part[i][j], x, wv[j]);
      }
    };
    int64_t kk = 0;
    for (; kk + 32 <= len; kk += 32) step(kk, ~__mmask32{0});
    if (kk < len) step(kk, static_cast<__mmask32>((uint64_t{1} << (len - kk)) - 1));

#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) {
      const __m512 scale = _mm512_set1_ps(scales[j][b]);
#pragma GCC unroll 32
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_fmadd_ps(part[i][j], scale, acc[i][j]);
    }
  }
  reduce_store<MR, NR>(acc, p.y + i0 * p.y_stride + j0, p.y_stride);
}

template <int MR, typename Weights>
void row_tile(const LinearProblem& p, const Weights& weights, int64_t i0, int64_t n_begin,
              int64_t n_end, uint16_t* xb) {
  constexpr int kNr = MR == 1 ? 6 : MR == 2 ? 4 : 2;
  const int64_t x_row = fp8_activation_row(p.k);
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) convert_row(p.x + (i0 + i) * p.x_stride, p.k, xb + i * x_row);
  int64_t j = n_begin;
  for (; j + kNr <= n_end; j += kNr) tile<MR, kNr>(p, weights, xb, x_row, i0, j);
  for (; j < n_end; ++j) tile<MR, 1>(p, weights, xb, x_row, i0, j);
}

template <typename Weights>
void all_rows(const LinearProblem& p, const Weights& weights, int64_t n_begin, int64_t n_end,
              uint16_t* xb) {
  for_each_row_tile(p.m, [&](auto rows, int64_t i) {
    row_tile<decltype(rows)::value>(p, weights, i, n_begin, n_end, xb);
  });
}

// Columns [n_begin, n_end) as bf16 into `decoded`, rows fp8_activation_row(k) apart, the
// padding zero.
void decode_columns(const LinearProblem& p, int64_t n_begin, int64_t n_end,
                    const DecodeTable& table, uint16_t* decoded) {
  const auto* w = static_cast<const uint8_t*>(p.w);
  const int64_t stride = fp8_activation_row(p.k);
  for (int64_t j = n_begin; j < n_end; ++j) {
    const uint8_t* codes = w + j * p.w_stride;
    uint16_t* out = decoded + (j - n_begin) * stride;
    for (int64_t kk = 0; kk < p.k; kk += 32) {
      const __mmask32 mask =
          p.k - kk >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << (p.k - kk)) - 1);
      _mm512_storeu_si512(out + kk,
                          (__m512i)decode32(_mm256_maskz_loadu_epi8(mask, codes + kk), table));
    }
  }
}

}  // namespace

void linear_cpu_fp8_columns_avx512_bf16(const LinearProblem& p, int64_t n_begin, int64_t n_end,
                                        uint16_t* scratch, uint16_t* decoded) {
  const DecodeTable table(fp8_e4m3_magnitudes_bf16());
  if (p.m < kFp8DecodeOnceMinRows) {
    all_rows(p, CodeWeights{static_cast<const uint8_t*>(p.w), p.w_stride, table}, n_begin, n_end,
             scratch);
    return;
  }
  decode_columns(p, n_begin, n_end, table, decoded);
  all_rows(p, DecodedWeights{decoded, fp8_activation_row(p.k), n_begin}, n_begin, n_end, scratch);
}

}  // namespace pdserve
