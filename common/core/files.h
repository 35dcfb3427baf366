// File access with errors that name the file: whole-file reads, JSON files, and read-only
// memory maps (RAII).
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "common/core/status.h"

namespace pdserve {

Result<std::string> read_text_file(const std::filesystem::path& path);
Result<nlohmann::json> read_json_file(const std::filesystem::path& path);
// Writes atomically enough for our tools: to a temporary file, then renamed over `path`.
Status write_file(const std::filesystem::path& path, std::string_view contents);

// A read-only, private memory map of a whole file. Movable, not copyable; unmaps on destruction.
class MappedFile {
 public:
  static Result<MappedFile> open(const std::filesystem::path& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void reset();

  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace pdserve
