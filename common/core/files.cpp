#include "common/core/files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace pdserve {
namespace {

std::string errno_message(const std::filesystem::path& path, const char* what) {
  return std::string("cannot ") + what + " '" + path.string() + "': " + std::strerror(errno);
}

}  // namespace

Result<std::string> read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return std::filesystem::exists(path)
               ? Status(StatusCode::kInvalidArgument, errno_message(path, "read"))
               : not_found("file not found: '" + path.string() + "'");
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return data_loss(errno_message(path, "read"));
  return buffer.str();
}

Result<nlohmann::json> read_json_file(const std::filesystem::path& path) {
  PDS_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return invalid_argument("malformed JSON in '" + path.string() + "': " + e.what());
  }
}

Status write_file(const std::filesystem::path& path, std::string_view contents) {
  std::filesystem::path temporary = path;
  temporary += ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) return invalid_argument(errno_message(temporary, "create"));
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    if (!out) return data_loss(errno_message(temporary, "write"));
  }
  std::error_code ec;
  std::filesystem::rename(temporary, path, ec);
  if (ec) return invalid_argument("cannot rename '" + temporary.string() + "': " + ec.message());
  return {};
}

Result<MappedFile> MappedFile::open(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return not_found("file not found: '" + path.string() + "'");
    return invalid_argument(errno_message(path, "open"));
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    Status status = invalid_argument(errno_message(path, "stat"));
    ::close(fd);
    return status;
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    return invalid_argument("not a regular file: '" + path.string() + "'");
  }
  MappedFile mapped;
  mapped.path_ = path;
  mapped.size_ = static_cast<size_t>(info.st_size);
  if (mapped.size_ > 0) {
    void* address = ::mmap(nullptr, mapped.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (address == MAP_FAILED) {
      Status status = resource_exhausted(errno_message(path, "mmap"));
      ::close(fd);
      return status;
    }
    mapped.data_ = static_cast<const std::byte*>(address);
  }
  ::close(fd);  // the mapping keeps the file alive
  return mapped;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    path_ = std::move(other.path_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

MappedFile::~MappedFile() {
  reset();
}

void MappedFile::reset() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace pdserve
