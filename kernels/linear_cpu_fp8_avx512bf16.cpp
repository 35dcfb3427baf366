// The avx512_bf16 level of linear_cpu for FP8 (E4M3) weights: 64 codes at a time become two
// vectors of 32 bf16 and meet the bf16-rounded activations in vdpbf16ps. Each k block's
// partial sums are multiplied by its scale into the running lanes (order: linear_problem.h).
// Compiled with the AVX-512 and AVX512_BF16 flags and only entered after the run-time CPU
// check.
//
// The widening is a shift: a normal code's magnitude bits, moved under bf16's exponent and
// mantissa with the exponent's top bits set (112 added to it), are the value times 2^-8 exactly;
// the 2^8 goes into the block scale. Three shifts and two bitwise selects make 64 codes, where a
// table lookup per code was the kernel's bottleneck. The codes this does not cover (zero and
// subnormal, which vdpbf16ps would flush, and NaN) are found with one test per 64 codes and
// looked up exactly instead; they are rare in trained weights. The shift leaves the even and the
// odd codes of a 64-byte load in separate vectors, so the activations are laid out the same way
// (fp8_activation_row in linear_problem.h).
//
// Below kFp8DecodeOnceMinRows rows (decode) every row tile widens the codes, column by column,
// reading 1 byte a weight; from it on (larger decode batches, prefill) the first row tile
// widens them and keeps the result in the caller's bf16 buffer, and every other row tile runs
// tiles of several columns over that. Same bf16 values, same order, bit for bit.
#include <type_traits>

#include "kernels/avx512_common.h"
#include "kernels/linear_problem.h"

namespace pdserve {
namespace {

// 64 k positions as two vectors of 32 bf16: `even` holds k = 2j, `odd` k = 2j + 1.
struct Bf16Pair {
  __m512bh even, odd;
};

// The exact widening of every code, for the few the shift does not cover: the bf16 of (value x
// 2^-8) for the magnitudes 0..127 (NaN for 127), four registers of 32, looked up by word.
struct ExactTable {
  __m512i quarter[4];
  explicit ExactTable(const uint16_t* magnitudes) {
    for (int q = 0; q < 4; ++q) quarter[q] = _mm512_loadu_si512(magnitudes + 32 * q);
  }
  // `codes`: one code in each word's low byte.
  __m512bh widen(__m512i codes) const {
    // Index bits 0-5 pick one of 64 words of a register pair; bit 6 picks the pair.
    const __m512i low = _mm512_permutex2var_epi16(quarter[0], codes, quarter[1]);
    const __m512i high = _mm512_permutex2var_epi16(quarter[2], codes, quarter[3]);
    const __mmask32 upper = _mm512_test_epi16_mask(codes, _mm512_set1_epi16(0x40));
    const __m512i magnitude = _mm512_mask_mov_epi16(low, upper, high);
    const __m512i sign = _mm512_slli_epi16(_mm512_and_si512(codes, _mm512_set1_epi16(0x80)), 8);
    return (__m512bh)_mm512_or_si512(magnitude, sign);
  }
};

// Sign, magnitude under bf16's exponent and mantissa, exponent + 112: (x & 0x87F0) | 0x3800.
inline __m512bh place(__m512i shifted) {
  return (__m512bh)_mm512_ternarylogic_epi32(
      shifted, _mm512_set1_epi16(static_cast<int16_t>(0x87F0)), _mm512_set1_epi16(0x3800), 0xEA);
}

inline Bf16Pair widen64(__m512i codes, const ExactTable& table) {
  // Zero, subnormal (exponent field 0) and NaN (magnitude 127) codes plus 1 have bits 4-6
  // clear; so do most codes of exponent field 1, as rare as the subnormals, which the lookup
  // widens just as exactly.
  const __mmask64 special =
      _mm512_testn_epi8_mask(_mm512_add_epi8(codes, _mm512_set1_epi8(1)), _mm512_set1_epi8(0x70));
  if (__builtin_expect(special != 0, 0)) {
    return {table.widen(_mm512_and_si512(codes, _mm512_set1_epi16(0x00FF))),
            table.widen(_mm512_srli_epi16(codes, 8))};
  }
  // An arithmetic shift by 4 puts a word's high code at bits 4-11 with its sign copied into 15.
  return {place(_mm512_srai_epi16(_mm512_slli_epi16(codes, 8), 4)),
          place(_mm512_srai_epi16(codes, 4))};
}

// The first `count` (<= 64) lanes' mask.
inline __mmask64 first_lanes64(int64_t count) {
  return count >= 64 ? ~__mmask64{0} : (__mmask64{1} << count) - 1;
}

// x[0, k) as bf16 into out in fp8_activation_row's layout: per scale block, 64 positions at a
// time, the even ones and then the odd ones, zero-padded to a multiple of 64.
inline void convert_row(const float* x, int64_t k, int64_t block_k, uint16_t* out) {
  const __m512i even =
      _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28, 26,
                       24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi16(even, _mm512_set1_epi16(1));
  const int64_t block_stride = fp8_block_stride(k, block_k);
  for (int64_t b0 = 0; b0 < k; b0 += block_k, out += block_stride) {
    const int64_t len = k - b0 < block_k ? k - b0 : block_k;
    for (int64_t kk = 0; kk < len; kk += 64) {
      __m256i half[4];
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) {
        const int64_t at = kk + 16 * q;
        const __mmask16 mask = first_lanes16(len > at ? len - at : 0);
        half[q] = to_bf16x16(_mm512_maskz_loadu_ps(mask, x + b0 + at));
      }
      const __m512i low = _mm512_inserti64x4(_mm512_castsi256_si512(half[0]), half[1], 1);
      const __m512i high = _mm512_inserti64x4(_mm512_castsi256_si512(half[2]), half[3], 1);
      _mm512_storeu_si512(out + kk, _mm512_permutex2var_epi16(low, even, high));
      _mm512_storeu_si512(out + kk + 32, _mm512_permutex2var_epi16(low, odd, high));
    }
  }
}

// The weights as codes, widened at every use.
struct CodeWeights {
  const uint8_t* w;
  int64_t stride;
  const ExactTable& table;
  // Positions [k0, k0 + count) of a column; `at` is their place in the activations' layout.
  Bf16Pair load64(int64_t column, int64_t k0, int64_t /*at*/, int64_t count) const {
    const uint8_t* codes = w + column * stride + k0;
    _mm_prefetch(reinterpret_cast<const char*>(codes) + kFp8PrefetchAhead, _MM_HINT_T0);
    return widen64(count >= 64 ? _mm512_loadu_si512(codes)
                               : _mm512_maskz_loadu_epi8(first_lanes64(count), codes),
                   table);
  }
};

// The weights of columns [first_column, ...) widened once, in the activations' layout.
struct WidenedWeights {
  const uint16_t* w;
  int64_t stride;
  int64_t first_column;
  Bf16Pair load64(int64_t column, int64_t /*k0*/, int64_t at, int64_t /*count*/) const {
    const uint16_t* row = w + (column - first_column) * stride + at;
    return {(__m512bh)_mm512_loadu_si512(row), (__m512bh)_mm512_loadu_si512(row + 32)};
  }
};

// The codes widened at their first use, by the first row tile of a batch, and kept in the
// activations' layout for the other row tiles (WidenedWeights), so that reading the codes from
// memory overlaps that tile's dot products.
struct WideningWeights {
  CodeWeights codes;
  uint16_t* w;
  int64_t stride;
  int64_t first_column;
  Bf16Pair load64(int64_t column, int64_t k0, int64_t at, int64_t count) const {
    const Bf16Pair pair = codes.load64(column, k0, at, count);
    uint16_t* row = w + (column - first_column) * stride + at;
    _mm512_storeu_si512(row, (__m512i)pair.even);
    _mm512_storeu_si512(row + 32, (__m512i)pair.odd);
    return pair;
  }
};

template <int MR, int NR, typename Weights>
inline void tile(const LinearProblem& p, const Weights& weights, const uint16_t* xb, int64_t x_row,
                 int64_t i0, int64_t j0) {
  const int64_t block_k = p.scale_block_k;
  const int64_t block_stride = fp8_block_stride(p.k, block_k);
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
    // The padding past a block's end is zero on both sides.
    for (int64_t kk = 0; kk < len; kk += 64) {
      const int64_t at = b * block_stride + kk;
      // All rows' even halves, then the odd ones: fewer registers live than both at once.
      Bf16Pair wv[NR];
#pragma GCC unroll 32
      for (int j = 0; j < NR; ++j) wv[j] = weights.load64(j0 + j, b0 + kk, at, len - kk);
#pragma GCC unroll 32
      for (int i = 0; i < MR; ++i) {
        const __m512bh x_even = (__m512bh)_mm512_loadu_si512(xb + i * x_row + at);
#pragma GCC unroll 32
        for (int j = 0; j < NR; ++j) part[i][j] = _mm512_dpbf16_ps(part[i][j], x_even, wv[j].even);
      }
#pragma GCC unroll 32
      for (int i = 0; i < MR; ++i) {
        const __m512bh x_odd = (__m512bh)_mm512_loadu_si512(xb + i * x_row + at + 32);
#pragma GCC unroll 32
        for (int j = 0; j < NR; ++j) part[i][j] = _mm512_dpbf16_ps(part[i][j], x_odd, wv[j].odd);
      }
    }
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) {
      const __m512 scale = _mm512_set1_ps(scales[j][b] * 256.0f);  // the widening's 2^-8
#pragma GCC unroll 32
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_fmadd_ps(part[i][j], scale, acc[i][j]);
    }
  }
  reduce_store<MR, NR>(acc, p.y + i0 * p.y_stride + j0, p.y_stride);
}

// Codes (widened here) go one column at a time, each read in address order and widened once for
// the tile's rows: the hardware prefetchers see one sequential stream (tiles of 2-6 columns
// interleaved, each 1-3 KiB long at Qwen3-0.6B's widths, read the codes about half as fast at
// one row and 15-25 % slower at 2-8), and the out-of-order window overlaps one column's chains of
// dot products with the next one's. Widened weights, from L2, go in tiles of several columns,
// which reuse each activation load.
template <int MR, typename Weights>
void row_tile(const LinearProblem& p, const Weights& weights, int64_t i0, int64_t n_begin,
              int64_t n_end, uint16_t* xb) {
  constexpr int kNr = !std::is_same_v<Weights, WidenedWeights> ? 1 : MR == 1 ? 6 : 4;
  const int64_t x_row = fp8_activation_row(p.k, p.scale_block_k);
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) {
    convert_row(p.x + (i0 + i) * p.x_stride, p.k, p.scale_block_k, xb + i * x_row);
  }
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

}  // namespace

void linear_cpu_fp8_columns_avx512_bf16(const LinearProblem& p, int64_t n_begin, int64_t n_end,
                                        uint16_t* scratch, uint16_t* decoded) {
  const ExactTable table(fp8_e4m3_magnitudes_bf16_scaled());
  const CodeWeights codes{static_cast<const uint8_t*>(p.w), p.w_stride, table};
  if (p.m < kFp8DecodeOnceMinRows) {
    all_rows(p, codes, n_begin, n_end, scratch);
    return;
  }
  const int64_t row = fp8_activation_row(p.k, p.scale_block_k);
  const WidenedWeights widened{decoded, row, n_begin};
  for_each_row_tile(p.m, [&](auto rows, int64_t i) {
    constexpr int kRows = decltype(rows)::value;
    if (i == 0) {
      row_tile<kRows>(p, WideningWeights{codes, decoded, row, n_begin}, i, n_begin, n_end, scratch);
    } else {
      row_tile<kRows>(p, widened, i, n_begin, n_end, scratch);
    }
  });
}

}  // namespace pdserve
