#include "kernels/backend.h"

#include <charconv>
#include <cstdlib>
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

Result<DeviceSpec> parse_device(std::string_view name) {
  const size_t colon = name.find(':');
  DeviceSpec spec;
  Result<DeviceKind> kind = parse_device_kind(name.substr(0, colon));
  if (!kind.ok() || (colon != std::string_view::npos && *kind != DeviceKind::kCuda)) {
    return invalid_argument("unknown device '" + std::string(name) +
                            "' (expected cpu, cuda or cuda:N)");
  }
  spec.kind = *kind;
  if (colon == std::string_view::npos) return spec;
  const std::string_view digits = name.substr(colon + 1);
  const auto [end, error] =
      std::from_chars(digits.data(), digits.data() + digits.size(), spec.index);
  if (digits.empty() || error != std::errc() || end != digits.data() + digits.size() ||
      spec.index < 0) {
    return invalid_argument("device '" + std::string(name) +
                            "': the CUDA device index must be a number >= 0");
  }
  return spec;
}

MatrixView MatrixView::column_slice(int64_t first_col, int64_t num_cols) const {
  const size_t offset = static_cast<size_t>(first_col) * dtype_size(dtype);
  return {static_cast<std::byte*>(data) + offset, dtype, rows, num_cols, row_stride};
}

Result<HostBuffer> Backend::allocate_host(size_t bytes) {
  constexpr size_t kAlignment = 64;
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* data = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  if (data == nullptr) {
    return resource_exhausted("cannot allocate " + std::to_string(bytes) + " bytes of host memory");
  }
  return HostBuffer(this, data, bytes);
}

void Backend::release_host(void* data) noexcept {
  std::free(data);
}

Result<std::unique_ptr<Backend>> create_backend(const BackendOptions& options) {
  // Checked before the device is opened, so a dtype no device path honours fails at once
  // (and never runs in another precision instead).
  if (options.device == DeviceKind::kCpu) {
    if (options.activation_dtype.has_value() && *options.activation_dtype != DType::kF32) {
      return invalid_argument("the CPU backend computes in float32, not " +
                              std::string(dtype_name(*options.activation_dtype)));
    }
    return make_cpu_backend(options.num_threads, options.cpu_isa);
  }
  const DType cuda_dtype = options.activation_dtype.value_or(DType::kBF16);
  if (cuda_dtype != DType::kBF16 && cuda_dtype != DType::kF32) {
    return invalid_argument(
        "--device cuda computes in bfloat16 (the default) or float32 "
        "(strict), not " +
        std::string(dtype_name(cuda_dtype)));
  }
  PDS_ASSIGN_OR_RETURN(int devices, cuda_device_count());
  if (options.device_index < 0 || options.device_index >= devices) {
    return unavailable("--device cuda: device index " + std::to_string(options.device_index) +
                       " is not among the " + std::to_string(devices) + " visible CUDA devices");
  }
#ifdef PDSERVE_WITH_CUDA
  return make_cuda_backend(options.device_index, cuda_dtype);
#else
  return unavailable("--device cuda: this build has no CUDA support");  // count said so first
#endif
}

}  // namespace pdserve
