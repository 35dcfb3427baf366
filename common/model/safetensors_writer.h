// Encodes safetensors headers for tensors laid out back to back; the caller streams the data.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/model/safetensors.h"

namespace pdserve {

// Fills in begin/end of each entry (packed in the given order, no gaps) and returns the 8-byte
// little-endian length followed by the JSON header, padded with spaces to a multiple of 8 so
// that the data region starts aligned. Entries need name, dtype and shape.
std::string encode_safetensors_header(std::vector<SafetensorsEntry>& tensors,
                                      const std::map<std::string, std::string>& metadata);

// Total data bytes of `tensors` (numel * dtype size, summed).
uint64_t safetensors_data_bytes(const std::vector<SafetensorsEntry>& tensors);

}  // namespace pdserve
