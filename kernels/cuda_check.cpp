#include "kernels/cuda_check.h"

#include <string>

namespace pdserve {
namespace {

std::string where(const char* call, const char* file, int line) {
  return std::string(call) + " at " + file + ":" + std::to_string(line);
}

}  // namespace

Status cuda_status(cudaError_t error, const char* call, const char* file, int line) {
  std::string message = "CUDA error " + std::string(cudaGetErrorName(error)) + " (" +
                        cudaGetErrorString(error) + ") in " + where(call, file, line);
  if (error == cudaErrorMemoryAllocation) return resource_exhausted(std::move(message));
  return internal_error(std::move(message));
}

Status cublas_status(cublasStatus_t status, const char* call, const char* file, int line) {
  std::string message = "cuBLAS error " + std::string(cublasGetStatusName(status)) + " (" +
                        cublasGetStatusString(status) + ") in " + where(call, file, line);
  if (status == CUBLAS_STATUS_ALLOC_FAILED) return resource_exhausted(std::move(message));
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_ARCH_MISMATCH) {
    return unimplemented(std::move(message));
  }
  return internal_error(std::move(message));
}

}  // namespace pdserve
