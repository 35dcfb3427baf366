// The disk tier's file access, behind an interface so that tests can make any call fail the
// way a full or failing disk does (ENOSPC, EIO) and truncate or corrupt what was written.
// Paths are absolute. Called from the store's worker thread (and at open).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "common/core/status.h"

namespace pdserve::kv_tiers {

class TierFiles {
 public:
  virtual ~TierFiles() = default;
  // Writes `parts` one after the other to a temporary file, then renames it over `path`, so a
  // reader never sees a half-written file under its name. ResourceExhausted for ENOSPC,
  // DataLoss for EIO, Internal otherwise; nothing is left under `path` or the temporary name.
  virtual Status write(const std::filesystem::path& path,
                       std::span<const std::span<const std::byte>> parts) = 0;
  // Reads into `out` from `offset`; the bytes read (fewer at the end of the file).
  virtual Result<std::size_t> read(const std::filesystem::path& path, std::uint64_t offset,
                                   std::span<std::byte> out) = 0;
  virtual Result<std::uint64_t> size(const std::filesystem::path& path) = 0;
  virtual Status remove(const std::filesystem::path& path) = 0;
  // The regular files directly in `dir`.
  virtual Result<std::vector<std::filesystem::path>> list(const std::filesystem::path& dir) = 0;
};

// The real file system (POSIX calls, so that errno reaches the Status).
class PosixTierFiles final : public TierFiles {
 public:
  Status write(const std::filesystem::path& path,
               std::span<const std::span<const std::byte>> parts) override;
  Result<std::size_t> read(const std::filesystem::path& path, std::uint64_t offset,
                           std::span<std::byte> out) override;
  Result<std::uint64_t> size(const std::filesystem::path& path) override;
  Status remove(const std::filesystem::path& path) override;
  Result<std::vector<std::filesystem::path>> list(const std::filesystem::path& dir) override;
};

}  // namespace pdserve::kv_tiers
