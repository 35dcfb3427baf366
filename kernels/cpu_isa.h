// The instruction-set level of the CPU backend's kernels, chosen once per backend instance.
//
// Each level has its own fixed arithmetic (reduction orders, exp polynomial, rounding of
// inputs), so a request's results are bitwise reproducible at a given level whatever the batch
// or the thread count, but differ in the last bits from one level to another:
//   portable      scalar C++, the specification of the avx2 order (the two agree bitwise);
//   avx2          AVX2 + FMA + F16C, eight-lane products;
//   avx512        AVX-512 F/BW/VL/DQ, sixteen-lane float32 products, vectorised attention,
//                 softmax, norms, RoPE and SiLU;
//   avx512_bf16   avx512 plus AVX512_BF16: the linear layers with bf16 weights and the
//                 attention scores over a bf16 KV cache multiply with vdpbf16ps, so their
//                 float32 inputs are rounded to bf16 first (as llama.cpp and GPU engines do);
//                 products are still accumulated in float32.
// Levels above portable are only used when CPUID reports them. PDSERVE_CPU_ISA (one of the
// names above, or "auto") overrides the automatic choice of the highest one, for tests and
// comparisons.
#pragma once

#include <string_view>
#include <vector>

#include "common/core/status.h"

namespace pdserve {

enum class CpuIsa { kAuto, kPortable, kAvx2, kAvx512, kAvx512Bf16 };

std::string_view cpu_isa_name(CpuIsa isa);
Result<CpuIsa> parse_cpu_isa(std::string_view name);

// Whether this CPU can run the level (kAuto and kPortable: always).
bool cpu_supports(CpuIsa isa);
// The highest level this CPU runs.
CpuIsa best_cpu_isa();
// Every level this CPU runs, lowest first (for tests that cover each one).
std::vector<CpuIsa> supported_cpu_isas();

// kAuto becomes PDSERVE_CPU_ISA when that is set, else best_cpu_isa(). A level the CPU lacks
// is Unavailable, an unknown PDSERVE_CPU_ISA value InvalidArgument.
Result<CpuIsa> resolve_cpu_isa(CpuIsa requested);

}  // namespace pdserve
