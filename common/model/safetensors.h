// Reader for the safetensors format: an 8-byte little-endian header length, a JSON header
// mapping tensor names to {dtype, shape, data_offsets}, then the raw data. Files are memory
// mapped; tensor views point into the map and keep it alive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/dtype.h"
#include "common/core/files.h"
#include "common/core/status.h"

namespace pdserve {

// A read-only view of one tensor's bytes in a mapped file.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t nbytes = 0;
  std::shared_ptr<const void> keep_alive;  // the mapping `data` points into
  int64_t numel() const;
};

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  size_t begin = 0;  // byte offsets relative to the start of the data region
  size_t end = 0;
};

struct SafetensorsLayout {
  size_t data_offset = 0;  // 8 + header length: where the data region starts in the file
  std::vector<SafetensorsEntry> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;
};

// Largest header we accept (the reference implementation uses the same bound).
inline constexpr size_t kMaxSafetensorsHeaderBytes = 100u << 20;

// Validates the header of a whole safetensors file held in `file_bytes`: header length within
// the file, a JSON object, known dtypes, non-negative shapes, ordered offsets inside the data
// region whose size matches the shape, no overlaps. `source` names the file in errors.
Result<SafetensorsLayout> parse_safetensors(std::span<const std::byte> file_bytes,
                                            const std::string& source);

class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return file_->path(); }
  const SafetensorsLayout& layout() const { return layout_; }
  const std::vector<SafetensorsEntry>& tensors() const { return layout_.tensors; }
  // The whole mapped file.
  std::span<const std::byte> bytes() const { return {file_->data(), file_->size()}; }

  bool contains(std::string_view name) const { return find(name) != nullptr; }
  const SafetensorsEntry* find(std::string_view name) const;
  // NOT_FOUND naming the tensor and the file when absent.
  Result<TensorView> tensor(std::string_view name) const;
  TensorView view(const SafetensorsEntry& entry) const;

 private:
  std::shared_ptr<const MappedFile> file_;
  SafetensorsLayout layout_;
};

}  // namespace pdserve
