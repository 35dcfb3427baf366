#include "common/model/safetensors.h"

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include "common/model/tensor_shape.h"

namespace pdserve {
namespace {

constexpr size_t kLengthPrefixBytes = 8;

uint64_t read_le64(const std::byte* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<uint64_t>(bytes[i]);
  return value;
}

[[noreturn]] void fail_tensor(const std::string& source, const std::string& name,
                              const std::string& problem) {
  PDS_THROW(StatusCode::kInvalidArgument,
            "safetensors file '" + source + "': tensor '" + name + "': " + problem);
}

size_t unsigned_field(const nlohmann::json& value, const std::string& source,
                      const std::string& name, const char* what) {
  if (!value.is_number_unsigned()) {
    fail_tensor(source, name,
                std::string(what) + " must be a non-negative integer, got " + value.dump());
  }
  return value.get<uint64_t>();
}

SafetensorsEntry parse_entry(const std::string& name, const nlohmann::json& value, size_t data_size,
                             const std::string& source) {
  if (!value.is_object()) fail_tensor(source, name, "entry must be a JSON object");
  SafetensorsEntry entry;
  entry.name = name;

  auto dtype_it = value.find("dtype");
  if (dtype_it == value.end() || !dtype_it->is_string()) {
    fail_tensor(source, name, "'dtype' must be a string");
  }
  Result<DType> dtype = parse_safetensors_dtype(dtype_it->get<std::string>());
  if (!dtype.ok()) fail_tensor(source, name, dtype.status().message());
  entry.dtype = *dtype;

  auto shape_it = value.find("shape");
  if (shape_it == value.end() || !shape_it->is_array()) {
    fail_tensor(source, name, "'shape' must be a list");
  }
  for (const nlohmann::json& dim : *shape_it) {
    size_t d = unsigned_field(dim, source, name, "shape dimension");
    if (d > static_cast<size_t>(INT64_MAX)) fail_tensor(source, name, "shape dimension too large");
    entry.shape.push_back(static_cast<int64_t>(d));
  }

  auto offsets_it = value.find("data_offsets");
  if (offsets_it == value.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
    fail_tensor(source, name, "'data_offsets' must be a list [begin, end]");
  }
  entry.begin = unsigned_field((*offsets_it)[0], source, name, "data offset");
  entry.end = unsigned_field((*offsets_it)[1], source, name, "data offset");
  if (entry.begin > entry.end) {
    fail_tensor(source, name,
                "data_offsets [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) +
                    "] are not ordered");
  }
  if (entry.end > data_size) {
    PDS_THROW(StatusCode::kDataLoss, "safetensors file '" + source + "': tensor '" + name +
                                         "': data_offsets end " + std::to_string(entry.end) +
                                         " is outside the data region (" +
                                         std::to_string(data_size) + " bytes; file truncated?)");
  }
  std::optional<int64_t> numel = checked_numel(entry.shape);
  size_t expected_bytes = 0;
  if (!numel || __builtin_mul_overflow(static_cast<size_t>(*numel), dtype_size(entry.dtype),
                                       &expected_bytes)) {
    fail_tensor(source, name, "shape " + shape_string(entry.shape) + " is too large");
  }
  if (entry.end - entry.begin != expected_bytes) {
    fail_tensor(source, name,
                "holds " + std::to_string(entry.end - entry.begin) + " bytes but shape " +
                    shape_string(entry.shape) + " of " +
                    std::string(safetensors_dtype_name(entry.dtype)) + " needs " +
                    std::to_string(expected_bytes));
  }
  return entry;
}

void check_no_overlaps(const std::vector<SafetensorsEntry>& tensors, const std::string& source) {
  std::vector<const SafetensorsEntry*> by_offset;
  for (const SafetensorsEntry& entry : tensors) {
    if (entry.end > entry.begin) by_offset.push_back(&entry);
  }
  std::sort(
      by_offset.begin(), by_offset.end(),
      [](const SafetensorsEntry* a, const SafetensorsEntry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      PDS_THROW(StatusCode::kInvalidArgument, "safetensors file '" + source + "': tensors '" +
                                                  by_offset[i - 1]->name + "' and '" +
                                                  by_offset[i]->name + "' overlap");
    }
  }
}

SafetensorsLayout parse_or_throw(std::span<const std::byte> bytes, const std::string& source) {
  if (bytes.size() < kLengthPrefixBytes) {
    PDS_THROW(StatusCode::kDataLoss, "safetensors file '" + source +
                                         "' is truncated: " + std::to_string(bytes.size()) +
                                         " bytes, too short for the 8-byte header length");
  }
  uint64_t header_length = read_le64(bytes.data());
  if (header_length > bytes.size() - kLengthPrefixBytes) {
    PDS_THROW(StatusCode::kDataLoss,
              "safetensors file '" + source + "': header length " + std::to_string(header_length) +
                  " runs past the end of the file (" + std::to_string(bytes.size()) + " bytes)");
  }
  if (header_length > kMaxSafetensorsHeaderBytes) {
    PDS_THROW(StatusCode::kInvalidArgument, "safetensors file '" + source + "': header length " +
                                                std::to_string(header_length) +
                                                " exceeds the 100 MiB limit");
  }
  const char* header_begin = reinterpret_cast<const char*>(bytes.data() + kLengthPrefixBytes);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_begin, header_begin + header_length);
  } catch (const nlohmann::json::exception& e) {
    PDS_THROW(StatusCode::kInvalidArgument,
              "safetensors file '" + source + "': malformed JSON header: " + e.what());
  }
  if (!header.is_object()) {
    PDS_THROW(StatusCode::kInvalidArgument,
              "safetensors file '" + source + "': header is not a JSON object");
  }

  SafetensorsLayout layout;
  layout.data_offset = kLengthPrefixBytes + header_length;
  size_t data_size = bytes.size() - layout.data_offset;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) {
        PDS_THROW(StatusCode::kInvalidArgument,
                  "safetensors file '" + source + "': __metadata__ must be a JSON object");
      }
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) {
          PDS_THROW(StatusCode::kInvalidArgument, "safetensors file '" + source +
                                                      "': __metadata__ value of '" + key +
                                                      "' must be a string");
        }
        layout.metadata[key] = text.get<std::string>();
      }
      continue;
    }
    layout.tensors.push_back(parse_entry(name, value, data_size, source));
  }
  check_no_overlaps(layout.tensors, source);
  return layout;
}

}  // namespace

int64_t TensorView::numel() const {
  return checked_numel(shape).value_or(0);
}

Result<SafetensorsLayout> parse_safetensors(std::span<const std::byte> file_bytes,
                                            const std::string& source) {
  return capture_status(
      [&]() -> Result<SafetensorsLayout> { return parse_or_throw(file_bytes, source); });
}

Result<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  PDS_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(path));
  SafetensorsFile file;
  file.file_ = std::make_shared<const MappedFile>(std::move(mapped));
  PDS_ASSIGN_OR_RETURN(file.layout_, parse_safetensors(file.bytes(), path.string()));
  return file;
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  auto it = std::lower_bound(
      layout_.tensors.begin(), layout_.tensors.end(), name,
      [](const SafetensorsEntry& entry, std::string_view key) { return entry.name < key; });
  return it != layout_.tensors.end() && it->name == name ? &*it : nullptr;
}

Result<TensorView> SafetensorsFile::tensor(std::string_view name) const {
  const SafetensorsEntry* entry = find(name);
  if (entry == nullptr) {
    return not_found("tensor '" + std::string(name) + "' is not in '" + path().string() + "'");
  }
  return view(*entry);
}

TensorView SafetensorsFile::view(const SafetensorsEntry& entry) const {
  TensorView view;
  view.name = entry.name;
  view.dtype = entry.dtype;
  view.shape = entry.shape;
  view.data = file_->data() + layout_.data_offset + entry.begin;
  view.nbytes = entry.end - entry.begin;
  view.keep_alive = file_;
  return view;
}

}  // namespace pdserve
