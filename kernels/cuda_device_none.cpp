#include "kernels/cuda_device.h"

namespace pdserve {

Result<int> cuda_device_count() {
  return unavailable(
      "--device cuda: this build has no CUDA support (configure where nvcc is installed, or "
      "with -DPDSERVE_CUDA=ON)");
}

}  // namespace pdserve
