#include "kernels/cpu_isa.h"

#include <cstdlib>
#include <string>
#include <vector>

namespace pdserve {

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
      return "auto";
    case CpuIsa::kPortable:
      return "portable";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx512Bf16:
      return "avx512_bf16";
  }
  return "?";
}

Result<CpuIsa> parse_cpu_isa(std::string_view name) {
  for (CpuIsa isa :
       {CpuIsa::kAuto, CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (name == cpu_isa_name(isa)) return isa;
  }
  return invalid_argument("unknown CPU instruction-set level '" + std::string(name) +
                          "' (expected auto, portable, avx2, avx512 or avx512_bf16)");
}

bool cpu_supports(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
    case CpuIsa::kPortable:
      return true;
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case CpuIsa::kAvx512:
      return cpu_supports(CpuIsa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq");
    case CpuIsa::kAvx512Bf16:
      return cpu_supports(CpuIsa::kAvx512) && __builtin_cpu_supports("avx512bf16");
  }
  return false;
}

std::vector<CpuIsa> supported_cpu_isas() {
  std::vector<CpuIsa> levels;
  for (CpuIsa isa : {CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (cpu_supports(isa)) levels.push_back(isa);
  }
  return levels;
}

CpuIsa best_cpu_isa() {
  return supported_cpu_isas().back();
}

Result<CpuIsa> resolve_cpu_isa(CpuIsa requested) {
  CpuIsa isa = requested;
  std::string source = "the requested";
  if (isa == CpuIsa::kAuto) {
    const char* forced = std::getenv("PDSERVE_CPU_ISA");
    if (forced == nullptr || *forced == '\0') return best_cpu_isa();
    Result<CpuIsa> parsed = parse_cpu_isa(forced);
    if (!parsed.ok()) return invalid_argument("PDSERVE_CPU_ISA: " + parsed.status().message());
    isa = *parsed;
    if (isa == CpuIsa::kAuto) return best_cpu_isa();
    source = "PDSERVE_CPU_ISA's";
  }
  if (!cpu_supports(isa)) {
    return unavailable(
        source + " CPU instruction-set level " + std::string(cpu_isa_name(isa)) +
        " is not supported by this CPU (best: " + std::string(cpu_isa_name(best_cpu_isa())) + ")");
  }
  return isa;
}

}  // namespace pdserve
