// Helpers for tensor shapes (row-major dimension lists).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace pdserve {

// Product of the dimensions (1 for a scalar); std::nullopt if a dimension is negative or the
// product overflows int64.
std::optional<int64_t> checked_numel(std::span<const int64_t> shape);
// "[151936, 1024]".
std::string shape_string(std::span<const int64_t> shape);

}  // namespace pdserve
