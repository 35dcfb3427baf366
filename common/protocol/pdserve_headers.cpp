#include "common/protocol/pdserve_headers.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace pdserve {

bool timeline_requested(std::optional<std::string_view> header_value) {
  if (!header_value) return false;
  std::string value(*header_value);
  std::ranges::transform(value, value.begin(),
                         [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return value == "1" || value == "true" || value == "on";
}

}  // namespace pdserve
