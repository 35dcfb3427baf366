// Helpers shared by the model tests: per-test temporary folders, file bytes, hashing, and
// synthetic tiny checkpoints.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/model/synthetic_checkpoint.h"

namespace pdserve::testing {

inline const std::filesystem::path kTinyConfig =
    std::filesystem::path(PDSERVE_TEST_DATA_DIR) / "model" / "tiny-qwen3" / "config.json";
inline const std::filesystem::path kTokenizerDir =
    std::filesystem::path(PDSERVE_ASSETS_DIR) / "qwen3-tokenizer";

// A fresh folder named after the running test (tests run as parallel processes); removed on
// destruction.
class TempDir {
 public:
  TempDir() {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("pdserve_model_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" +
             std::to_string(::getpid()) + "_" + std::to_string(next_id()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  static int next_id() {
    static std::atomic<int> counter{0};
    return counter++;
  }
  std::filesystem::path path_;
};

inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline void write_json(const std::filesystem::path& path, const nlohmann::json& json) {
  write_bytes(path, json.dump(2));
}

inline nlohmann::json read_json(const std::filesystem::path& path) {
  return nlohmann::json::parse(read_bytes(path));
}

// FNV-1a 64 over a file's bytes.
inline uint64_t hash_file(const std::filesystem::path& path) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (char c : read_bytes(path)) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

inline SyntheticCheckpointOptions tiny_options(const std::filesystem::path& out,
                                               uint64_t seed = 1) {
  SyntheticCheckpointOptions options;
  options.config_path = kTinyConfig;
  options.out_dir = out;
  options.seed = seed;
  options.tokenizer_dir = kTokenizerDir;
  return options;
}

// Writes a tiny checkpoint (asserting success) and returns its folder.
inline std::filesystem::path make_tiny(const SyntheticCheckpointOptions& options) {
  Result<SyntheticCheckpoint> written = write_synthetic_checkpoint(options);
  EXPECT_TRUE(written.ok()) << written.status().to_string();
  return options.out_dir;
}

// EXPECT that `status` failed and its message contains each of `parts`.
inline void expect_error_mentions(const Status& status, std::initializer_list<std::string> parts) {
  EXPECT_FALSE(status.ok());
  for (const std::string& part : parts) {
    EXPECT_NE(status.message().find(part), std::string::npos)
        << "message '" << status.message() << "' lacks '" << part << "'";
  }
}

}  // namespace pdserve::testing
