// CPU-only builds: no device step path (the CUDA backend cannot be created either).
#include "kernels/model/device_step_path.h"

namespace pdserve {

Result<std::unique_ptr<DeviceStepPath>> make_cuda_step_path(Backend&, Qwen3Model&, KvCache&,
                                                            ForwardContext&, int, bool) {
  return unimplemented("CUDA steps: this build has no CUDA support");
}

Result<DeviceMemoryInfo> device_memory_info(Backend&) {
  return unimplemented("device memory: this build has no CUDA support");
}

}  // namespace pdserve
