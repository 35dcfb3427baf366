// Compiled with -mavx512f -mavx512bf16; entered only after the run-time CPU check.
// GCC 12 warns about its own intrinsics' undefined vectors (bug 105593, fixed in GCC 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#include <omp.h>

#include <chrono>

#include "bench/cpu_model/peak_flops.h"

namespace pdserve {

double bf16_dot_peak_gflops(int threads) {
  constexpr int kChains = 12;  // enough independent accumulators to cover the latency
  constexpr long kIterations = 20'000'000;
  double best = 0;
  for (int trial = 0; trial < 3; ++trial) {
    const auto start = std::chrono::steady_clock::now();
    float sink = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
      __m512 acc[kChains];
      for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
      const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);  // (1.0, 1.0)
      const __m512bh b = (__m512bh)_mm512_set1_epi32(0x00010001);  // tiny: no overflow
      for (long i = 0; i < kIterations / threads; ++i) {
#pragma GCC unroll 12
        for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
      }
      __m512 total = acc[0];
      for (int c = 1; c < kChains; ++c) total = _mm512_add_ps(total, acc[c]);
      sink += _mm512_reduce_add_ps(total);
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // Each vdpbf16ps: 16 lanes x 2 multiply-adds x 2 flops.
    const double flops = static_cast<double>(kIterations / threads) * threads * kChains * 64.0;
    if (sink != sink) return 0;  // keeps the loop alive
    best = best > flops / seconds / 1e9 ? best : flops / seconds / 1e9;
  }
  return best;
}

}  // namespace pdserve
