// The compute ceiling of the bf16 linear layers: the throughput of vdpbf16ps on registers
// alone (no memory traffic), on all threads.
#pragma once

namespace pdserve {

// GFLOP/s (two per multiply-add) of independent vdpbf16ps chains on `threads` threads. Only
// call on a CPU with AVX512_BF16 (cpu_supports(CpuIsa::kAvx512Bf16)).
double bf16_dot_peak_gflops(int threads);

}  // namespace pdserve
