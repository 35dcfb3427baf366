#include "common/model/safetensors_writer.h"

#include <algorithm>

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
  size_t offset = 0;
  for (SafetensorsEntry& entry : tensors) {
    entry.begin = offset;
    entry.end = offset + tensor_bytes(entry);
    offset = entry.end;
  }
  // The layout of the safetensors library's own writer (what transformers' save_pretrained
  // produces): metadata first, then the tensors by name, each as dtype, shape, data_offsets.
  // Same weights then give the same bytes.
  std::vector<const SafetensorsEntry*> by_name;
  for (const SafetensorsEntry& entry : tensors) by_name.push_back(&entry);
  std::sort(by_name.begin(), by_name.end(),
            [](const SafetensorsEntry* a, const SafetensorsEntry* b) { return a->name < b->name; });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const SafetensorsEntry* entry : by_name) {
    nlohmann::ordered_json fields = nlohmann::ordered_json::object();
    fields["dtype"] = safetensors_dtype_name(entry->dtype);
    fields["shape"] = entry->shape;
    fields["data_offsets"] = {entry->begin, entry->end};
    header[entry->name] = std::move(fields);
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
