#include "kv_tiers/tier_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace pdserve::kv_tiers {
namespace {

Status errno_status(const std::string& what, const std::filesystem::path& path, int error) {
  const std::string message = what + " " + path.string() + ": " + std::strerror(error);
  if (error == ENOSPC || error == EDQUOT) return resource_exhausted(message);
  if (error == EIO) return data_loss(message);
  if (error == ENOENT) return not_found(message);
  return internal_error(message);
}

// Closes on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

Status write_all(int fd, std::span<const std::byte> bytes, const std::filesystem::path& path) {
  while (!bytes.empty()) {
    const ssize_t written = ::write(fd, bytes.data(), bytes.size());
    if (written < 0 && errno == EINTR) continue;
    if (written < 0) return errno_status("writing", path, errno);
    bytes = bytes.subspan(static_cast<std::size_t>(written));
  }
  return Status::ok_status();
}

}  // namespace

Status PosixTierFiles::write(const std::filesystem::path& path,
                             std::span<const std::span<const std::byte>> parts) {
  std::filesystem::path temporary = path;
  temporary += ".tmp";
  Fd fd(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return errno_status("creating", temporary, errno);
  Status status = Status::ok_status();
  for (std::span<const std::byte> part : parts) {
    status = write_all(fd.get(), part, temporary);
    if (!status.ok()) break;
  }
  if (status.ok() && ::close(fd.release()) != 0) status = errno_status("closing", temporary, errno);
  if (status.ok() && ::rename(temporary.c_str(), path.c_str()) != 0) {
    status = errno_status("renaming", temporary, errno);
  }
  if (!status.ok()) ::unlink(temporary.c_str());
  return status;
}

Result<std::size_t> PosixTierFiles::read(const std::filesystem::path& path, std::uint64_t offset,
                                         std::span<std::byte> out) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return errno_status("opening", path, errno);
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t got =
        ::pread(fd.get(), out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return errno_status("reading", path, errno);
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return done;
}

Result<std::uint64_t> PosixTierFiles::size(const std::filesystem::path& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return errno_status("stat of", path, errno);
  return static_cast<std::uint64_t>(info.st_size);
}

Status PosixTierFiles::remove(const std::filesystem::path& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return errno_status("removing", path, errno);
  return Status::ok_status();
}

Result<std::vector<std::filesystem::path>> PosixTierFiles::list(const std::filesystem::path& dir) {
  std::error_code error;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    if (entry.is_regular_file(error)) files.push_back(entry.path());
  }
  if (error) return internal_error("listing " + dir.string() + ": " + error.message());
  return files;
}

}  // namespace pdserve::kv_tiers
