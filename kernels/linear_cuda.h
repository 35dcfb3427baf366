// out = in @ weight^T on cuBLAS: bf16 (or float32) inputs, float32 accumulation, output in
// the view's dtype (bf16 activations, float32 logits).
#pragma once

#include <cublas_v2.h>

#include "kernels/backend.h"

namespace pdserve {

// Unimplemented for a dtype combination cuBLAS is not asked to do here.
Status linear_cuda(cublasHandle_t handle, MatrixView in, MatrixView weight, MatrixView out);

}  // namespace pdserve
