// The CPU backend: float32 activations, bf16/f16/f32 weights, a CpuThreadPool, kernels of one
// instruction-set level (kernels/cpu_isa.h). It is the reference every other backend is
// tested against, and a real serving backend.
#pragma once

#include <memory>

#include "kernels/backend.h"
#include "kernels/cpu_isa.h"

namespace pdserve {

// num_threads <= 0: all cores. `isa` kAuto: PDSERVE_CPU_ISA or the best level of this CPU;
// an unknown or unsupported level is an error (resolve_cpu_isa).
Result<std::unique_ptr<Backend>> make_cpu_backend(int num_threads, CpuIsa isa = CpuIsa::kAuto);
// The level a CPU backend runs at; kAuto for other backends.
CpuIsa cpu_backend_isa(const Backend& backend);

}  // namespace pdserve
