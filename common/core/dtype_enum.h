// The element-type enum alone, with no other includes, so that translation units compiled for
// a specific instruction set (kernels/*_avx2.cpp) can use it without pulling in shared inline
// code.
#pragma once

namespace pdserve {

enum class DType { kBF16, kF16, kF32 };

}  // namespace pdserve
