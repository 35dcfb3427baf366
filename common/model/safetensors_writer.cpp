#include "common/model/safetensors_writer.h"

#include <nlohmann/json.hpp>

#include "common/model/tensor_shape.h"

namespace pdserve {
namespace {

size_t tensor_bytes(const SafetensorsEntry& entry) {
  return static_cast<size_t>(checked_numel(entry.shape).value_or(0)) * dtype_size(entry.dtype);
}

}  // namespace

std::string encode_safetensors_header(std::vector<SafetensorsEntry>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (SafetensorsEntry& entry : tensors) {
    entry.begin = offset;
    entry.end = offset + tensor_bytes(entry);
    offset = entry.end;
    header[entry.name] = {{"dtype", safetensors_dtype_name(entry.dtype)},
                          {"shape", entry.shape},
                          {"data_offsets", {entry.begin, entry.end}}};
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string encoded(8, '\0');
  uint64_t length = json.size();
  for (int i = 0; i < 8; ++i) encoded[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return encoded + json;
}

uint64_t safetensors_data_bytes(const std::vector<SafetensorsEntry>& tensors) {
  uint64_t total = 0;
  for (const SafetensorsEntry& entry : tensors) total += tensor_bytes(entry);
  return total;
}

}  // namespace pdserve
