// Turns CUDA runtime and cuBLAS error codes into a Status naming the failed call and its
// file:line. Host code only; every CUDA call and kernel launch of the backend goes through it.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "common/core/status.h"

namespace pdserve {

// Out-of-memory becomes ResourceExhausted, anything else Internal.
Status cuda_status(cudaError_t error, const char* call, const char* file, int line);
Status cublas_status(cublasStatus_t status, const char* call, const char* file, int line);

}  // namespace pdserve

#define PDS_CUDA_RETURN_IF_ERROR(expr)                                           \
  do {                                                                           \
    const cudaError_t pds_cuda_error_ = (expr);                                  \
    if (pds_cuda_error_ != cudaSuccess) {                                        \
      return ::pdserve::cuda_status(pds_cuda_error_, #expr, __FILE__, __LINE__); \
    }                                                                            \
  } while (0)

#define PDS_CUBLAS_RETURN_IF_ERROR(expr)                                              \
  do {                                                                                \
    const cublasStatus_t pds_cublas_status_ = (expr);                                 \
    if (pds_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                \
      return ::pdserve::cublas_status(pds_cublas_status_, #expr, __FILE__, __LINE__); \
    }                                                                                 \
  } while (0)
