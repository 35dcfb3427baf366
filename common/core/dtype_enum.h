// The element-type enum alone, with no other includes, so that translation units compiled for
// a specific instruction set (kernels/*_avx2.cpp) can use it without pulling in shared inline
// code.
#pragma once

namespace pdserve {

// kF8E4M3 is a storage type only (FP8 weights with their scales, an FP8 KV cache): nothing
// computes in it, and the compute-dtype parser (parse_dtype) does not accept it.
enum class DType { kBF16, kF16, kF32, kF8E4M3 };

}  // namespace pdserve
