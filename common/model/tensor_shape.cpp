#include "common/model/tensor_shape.h"

namespace pdserve {

std::optional<int64_t> checked_numel(std::span<const int64_t> shape) {
  int64_t numel = 1;
  for (int64_t dim : shape) {
    if (dim < 0 || __builtin_mul_overflow(numel, dim, &numel)) return std::nullopt;
  }
  return numel;
}

std::string shape_string(std::span<const int64_t> shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

}  // namespace pdserve
