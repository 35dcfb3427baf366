// The CUDA backend: bf16 activations and weights with float32 accumulation (the default), or
// strict float32 (float32 everywhere, cuBLAS in pedantic float32: no TF32, no reduced-precision
// reductions); one stream and one cuBLAS handle per instance. Only built when CUDA is;
// create_backend({kCuda}) returns it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "kernels/backend.h"

namespace pdserve {

// `activation_dtype` is kBF16 or kF32 (InvalidArgument otherwise). Unavailable when the device
// cannot be opened; ResourceExhausted when its stream, cuBLAS handle or bookkeeping cannot be
// allocated.
Result<std::unique_ptr<Backend>> make_cuda_backend(int device_index, DType activation_dtype);

// The stream every operation of a CUDA backend is queued on (for graph capture);
// InvalidArgument when `backend` is not a CUDA backend.
Result<cudaStream_t> cuda_stream_of(Backend& backend);

struct CudaMemoryInfo {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  int multiprocessors = 0;
};
Result<CudaMemoryInfo> cuda_memory_info(Backend& backend);

}  // namespace pdserve
