// The CPU backend: float32 activations, bf16/f16/f32 weights, OpenMP threads. It is the
// reference every other backend is tested against, and a real serving backend.
#pragma once

#include <memory>

#include "kernels/backend.h"

namespace pdserve {

std::unique_ptr<Backend> make_cpu_backend(int num_threads);

}  // namespace pdserve
