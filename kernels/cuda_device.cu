#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda_device.h"

namespace pdserve {

Result<int> cuda_device_count() {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    return unavailable(std::string("--device cuda: no usable CUDA device (") +
                       cudaGetErrorString(error) + ")");
  }
  if (count == 0) return unavailable("--device cuda: no CUDA device is visible");
  return count;
}

}  // namespace pdserve
