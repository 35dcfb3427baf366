// The avx512_bf16 level of linear_cpu for bf16 weights: the activations are rounded to bf16
// (round to nearest even, as float_to_bf16) and multiplied with vdpbf16ps, which adds the
// two products of a pair of k into each float32 lane. Compiled with the AVX-512 and
// AVX512_BF16 flags and only entered after the run-time CPU check (kernels/cpu_isa.h).
//
// Reduction order of every output element: lane l (of 16) accumulates the pairs
// k = 2l, 2l + 1 of every 32 consecutive k (vdpbf16ps), the k % 32 tail in a final step with
// the missing elements zero, then the lanes are summed with the fixed tree of sum_lanes16.
// The row and column tiling, the k chunks the activations are converted in and the thread
// count never change this order.
#include "kernels/avx512_common.h"
#include "kernels/linear_problem.h"

namespace pdserve {
namespace {

// Activation elements per row converted to bf16 at a time (a multiple of 32); a tile keeps
// its accumulators across chunks, so chunking changes nothing in the arithmetic.
constexpr int64_t kChunk = kLinearActivationChunk;
constexpr int kMaxRows = kLinearRowTile;

// x[0, count) as bf16 into out, zero-padded to a multiple of 32.
inline void convert_chunk(const float* x, int64_t count, uint16_t* out) {
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), to_bf16x16(_mm512_loadu_ps(x + i)));
  }
  const int64_t padded = (count + 31) / 32 * 32;
  for (; i < padded; i += 16) {
    const __mmask16 mask = first_lanes16(count > i ? count - i : 0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        to_bf16x16(_mm512_maskz_loadu_ps(mask, x + i)));
  }
}

// One chunk [k0, k0 + len) of an MR x NR tile. `xb` holds the chunk of the MR rows (row
// stride kChunk). Accumulators live in `saved` between chunks of a long k.
// A lone activation row (MR == 1) reads its weights row after row, in address order: the
// hardware prefetchers see one sequential stream (two threads read ~1.3x faster than with the
// rows interleaved). A batch (compute-bound) steps through k with all NR rows at once; its
// first row tile, which streams the weights from memory (`stream`), fetches the next tile's
// into L2 meanwhile, in address order when the rows are contiguous. Neither changes the order
// of any element's sum.
template <int MR, int NR>
inline void tile_chunk(const LinearProblem& p, const uint16_t (*xb)[kChunk], int64_t i0, int64_t j0,
                       int64_t k0, int64_t len, bool first, bool last, bool stream,
                       __m512 (*saved)[kMaxRows]) {
  const auto* w_base = static_cast<const uint16_t*>(p.w);
  const char* next_tile = reinterpret_cast<const char*>(w_base + (j0 + NR) * p.w_stride + k0);
  const bool contiguous = p.w_stride == p.k && len == p.k;
  __m512 acc[MR][NR];
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) acc[i][j] = first ? _mm512_setzero_ps() : saved[j][i];
  }
  const int64_t len_vec = len - len % 32;
  if constexpr (MR == 1) {
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) {
      const uint16_t* row = w_base + (j0 + j) * p.w_stride + k0;
#pragma GCC unroll 4
      for (int64_t k = 0; k < len_vec; k += 32) {
        acc[0][j] = _mm512_dpbf16_ps(acc[0][j], (__m512bh)_mm512_loadu_si512(xb[0] + k),
                                     (__m512bh)_mm512_loadu_si512(row + k));
      }
    }
  }
  int64_t kk = MR == 1 ? len_vec : 0;
  for (; kk + 32 <= len; kk += 32) {
    __m512bh w[NR];
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) {
      const uint16_t* row = w_base + (j0 + j) * p.w_stride + k0 + kk;
      if (stream) {
        _mm_prefetch(contiguous ? next_tile + (kk / 32 * NR + j) * 64
                                : reinterpret_cast<const char*>(row + NR * p.w_stride),
                     _MM_HINT_T1);
      }
      w[j] = (__m512bh)_mm512_loadu_si512(row);
    }
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
      const __m512bh x = (__m512bh)_mm512_loadu_si512(xb[i] + kk);
#pragma GCC unroll 32
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], x, w[j]);
    }
  }
  if (kk < len) {
    const __mmask32 mask = static_cast<__mmask32>((uint64_t{1} << (len - kk)) - 1);
    __m512bh w[NR];
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) {
      w[j] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w_base + (j0 + j) * p.w_stride + k0 + kk);
    }
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
      const __m512bh x = (__m512bh)_mm512_loadu_si512(xb[i] + kk);
#pragma GCC unroll 32
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], x, w[j]);
    }
  }
  if (last) {
    reduce_store<MR, NR>(acc, p.y + i0 * p.y_stride + j0, p.y_stride);
  } else {
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 32
      for (int j = 0; j < NR; ++j) saved[j][i] = acc[i][j];
    }
  }
}

template <int MR>
void row_tile(const LinearProblem& p, int64_t i0, int64_t n_begin, int64_t n_end) {
  constexpr int kNr = MR == 1 ? 8 : 6;
  alignas(64) uint16_t xb[MR][kChunk];
  // Accumulators of every column of the block between k chunks (only used when k > kChunk).
  alignas(64) __m512 saved[kMaxLinearColumnBlock][kMaxRows];
  for (int64_t k0 = 0; k0 < p.k; k0 += kChunk) {
    const int64_t len = p.k - k0 < kChunk ? p.k - k0 : kChunk;
    const bool first = k0 == 0;
    const bool last = k0 + len == p.k;
    const bool stream = i0 == 0 && MR > 1;
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) convert_chunk(p.x + (i0 + i) * p.x_stride + k0, len, xb[i]);
    int64_t j = n_begin;
    for (; j + kNr <= n_end; j += kNr) {
      tile_chunk<MR, kNr>(p, xb, i0, j, k0, len, first, last, stream, saved + (j - n_begin));
    }
    for (; j < n_end; ++j) {
      tile_chunk<MR, 1>(p, xb, i0, j, k0, len, first, last, stream, saved + (j - n_begin));
    }
  }
}

}  // namespace

void linear_cpu_columns_avx512_bf16(const LinearProblem& p, int64_t n_begin, int64_t n_end) {
  for_each_row_tile(p.m, [&](auto rows, int64_t i) {
    row_tile<decltype(rows)::value>(p, i, n_begin, n_end);
  });
}

}  // namespace pdserve
