#include "common/core/files.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace pdserve {
namespace {

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("pdserve_files_test_" + name);
}

TEST(Files, WriteThenReadAndMap) {
  auto path = temp_path("data.bin");
  ASSERT_TRUE(write_file(path, "hello\0world").ok());
  EXPECT_EQ(read_text_file(path).value(), "hello");
  ASSERT_TRUE(write_file(path, std::string_view("abc\0def", 7)).ok());
  Result<MappedFile> mapped = MappedFile::open(path);
  ASSERT_TRUE(mapped.ok());
  ASSERT_EQ(mapped->size(), 7u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(mapped->data()), 7),
            std::string("abc\0def", 7));
  MappedFile moved = std::move(mapped).value();
  EXPECT_EQ(moved.size(), 7u);
  std::filesystem::remove(path);
}

TEST(Files, MissingFileIsNotFound) {
  EXPECT_EQ(read_text_file(temp_path("absent")).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(MappedFile::open(temp_path("absent")).status().code(), StatusCode::kNotFound);
}

TEST(Files, DirectoryCannotBeMapped) {
  EXPECT_EQ(MappedFile::open(std::filesystem::temp_directory_path()).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(Files, MalformedJsonNamesTheFile) {
  auto path = temp_path("bad.json");
  ASSERT_TRUE(write_file(path, "{\"a\": [1, 2").ok());
  Result<nlohmann::json> parsed = read_json_file(path);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("bad.json"), std::string::npos);
  ASSERT_TRUE(write_file(path, "{\"a\": [1, 2]}").ok());
  EXPECT_EQ(read_json_file(path).value()["a"][1], 2);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace pdserve
