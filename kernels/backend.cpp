#include "kernels/backend.h"

#include <string>

#include "kernels/cpu_backend.h"
#include "kernels/cuda_device.h"
#ifdef PDSERVE_WITH_CUDA
#include "kernels/cuda_backend.h"
#endif

namespace pdserve {

std::string_view device_kind_name(DeviceKind kind) {
  return kind == DeviceKind::kCpu ? "cpu" : "cuda";
}

Result<DeviceKind> parse_device_kind(std::string_view name) {
  if (name == "cpu") return DeviceKind::kCpu;
  if (name == "cuda") return DeviceKind::kCuda;
  return invalid_argument("unknown device '" + std::string(name) + "' (expected cpu or cuda)");
}

MatrixView MatrixView::column_slice(int64_t first_col, int64_t num_cols) const {
  const size_t offset = static_cast<size_t>(first_col) * dtype_size(dtype);
  return {static_cast<std::byte*>(data) + offset, dtype, rows, num_cols, row_stride};
}

Result<std::unique_ptr<Backend>> create_backend(const BackendOptions& options) {
  if (options.device == DeviceKind::kCpu)
    return make_cpu_backend(options.num_threads, options.cpu_isa);
  PDS_ASSIGN_OR_RETURN(int devices, cuda_device_count());
  if (options.device_index < 0 || options.device_index >= devices) {
    return unavailable("--device cuda: device index " + std::to_string(options.device_index) +
                       " is not among the " + std::to_string(devices) + " visible CUDA devices");
  }
#ifdef PDSERVE_WITH_CUDA
  return make_cuda_backend(options.device_index);
#else
  return unavailable("--device cuda: this build has no CUDA support");  // count said so first
#endif
}

}  // namespace pdserve
