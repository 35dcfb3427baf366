// out = in @ weight^T on cuBLAS: bf16 inputs with float32 accumulation, or float32 inputs in
// pedantic float32 (no TF32, no reduced-precision reductions); output in the view's dtype
// (the inputs' or float32: logits).
#pragma once

#include <cublas_v2.h>

#include "kernels/backend.h"

namespace pdserve {

// Unimplemented for a dtype combination cuBLAS is not asked to do here.
Status linear_cuda(cublasHandle_t handle, MatrixView in, MatrixView weight, MatrixView out);

}  // namespace pdserve
