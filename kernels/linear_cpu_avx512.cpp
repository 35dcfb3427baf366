// The avx512 level of linear_cpu: sixteen float32 lanes per weight row, bf16/f16 weights
// widened in registers, FMA. Compiled with the AVX-512 F/BW/VL/DQ flags and only entered after
// the run-time CPU check (kernels/cpu_isa.h).
//
// Reduction order of every output element: lane l (of 16) accumulates x[k] * w[k] for
// k = l, l + 16, l + 32, ... (the k % 16 tail in lanes 0.. of a final masked step), then the
// lanes are summed with the fixed tree of sum_lanes16. Tiles of different shapes only change
// how many elements are computed together, never this order.
#include "kernels/avx512_common.h"
#include "kernels/linear_problem.h"

namespace pdserve {
namespace {

template <DType W>
constexpr int64_t weight_bytes() {
  return W == DType::kF32 ? 4 : 2;
}

// `stream`: these weights come from memory (the first row tile of a block): the next tile's
// are fetched into L2 meanwhile, in address order when the rows are contiguous (see
// linear_cpu_avx512bf16.cpp).
template <DType W, int MR, int NR>
inline void tile(const LinearProblem& p, int64_t i0, int64_t j0, bool stream) {
  __m512 acc[MR][NR];
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  const char* w_bytes = static_cast<const char*>(p.w);
  constexpr int64_t kStepBytes = 16 * weight_bytes<W>();  // per row and k step
  const char* next_tile = w_bytes + (j0 + NR) * p.w_stride * weight_bytes<W>();
  const bool contiguous = p.w_stride == p.k;
  const int64_t k_vec = p.k - p.k % 16;
  if constexpr (MR == 1) {
    // A lone activation row: weights row after row, in address order (see
    // linear_cpu_avx512bf16.cpp).
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) {
#pragma GCC unroll 4
      for (int64_t k = 0; k < k_vec; k += 16) {
        acc[0][j] = _mm512_fmadd_ps(_mm512_loadu_ps(p.x + i0 * p.x_stride + k),
                                    load16(p.w, W, (j0 + j) * p.w_stride + k), acc[0][j]);
      }
    }
  }
  for (int64_t kk = MR == 1 ? k_vec : 0; kk < k_vec; kk += 16) {
    if (stream) {
      if (contiguous) {
        const char* step = next_tile + kk / 16 * NR * kStepBytes;
#pragma GCC unroll 32
        for (int64_t line = 0; line < NR * kStepBytes; line += 64) {
          _mm_prefetch(step + line, _MM_HINT_T1);
        }
      } else {
#pragma GCC unroll 32
        for (int j = 0; j < NR; ++j) {
          _mm_prefetch(w_bytes + ((j0 + NR + j) * p.w_stride + kk) * weight_bytes<W>(),
                       _MM_HINT_T1);
        }
      }
    }
    __m512 w[NR];
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) w[j] = load16(p.w, W, (j0 + j) * p.w_stride + kk);
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
      const __m512 x = _mm512_loadu_ps(p.x + (i0 + i) * p.x_stride + kk);
#pragma GCC unroll 32
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(x, w[j], acc[i][j]);
    }
  }
  if (k_vec < p.k) {
    const __mmask16 mask = first_lanes16(p.k - k_vec);
    __m512 w[NR];
#pragma GCC unroll 32
    for (int j = 0; j < NR; ++j) w[j] = load16(p.w, W, (j0 + j) * p.w_stride + k_vec, mask);
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
      const __m512 x = _mm512_maskz_loadu_ps(mask, p.x + (i0 + i) * p.x_stride + k_vec);
#pragma GCC unroll 32
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(x, w[j], acc[i][j]);
    }
  }
  reduce_store<MR, NR>(acc, p.y + i0 * p.y_stride + j0, p.y_stride);
}

template <DType W, int MR>
void row_tile(const LinearProblem& p, int64_t i0, int64_t n_begin, int64_t n_end) {
  constexpr int kNr = MR == 1 ? 8 : 6;
  int64_t j = n_begin;
  const bool stream = i0 == 0 && MR > 1;
  for (; j + kNr <= n_end; j += kNr) tile<W, MR, kNr>(p, i0, j, stream);
  for (; j < n_end; ++j) tile<W, MR, 1>(p, i0, j, stream);
}

}  // namespace

void linear_cpu_columns_avx512(const LinearProblem& p, int64_t n_begin, int64_t n_end) {
  with_weight_dtype(p.w_dtype, [&](auto w) {
    for_each_row_tile(p.m, [&](auto rows, int64_t i) {
      row_tile<decltype(w)::value, decltype(rows)::value>(p, i, n_begin, n_end);
    });
  });
}

}  // namespace pdserve
