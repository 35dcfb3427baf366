// The safetensors reader against hand-built files: valid layouts and every kind of damage.
#include "common/model/safetensors.h"

#include <cstring>

#include <gtest/gtest.h>

#include "common/model/safetensors_writer.h"
#include "tests/model/model_test_util.h"

namespace pdserve {
namespace {

using testing::expect_error_mentions;
using testing::TempDir;

// 8-byte little-endian length, header text, data: built by hand, independent of the writer.
std::string file_bytes(const std::string& header, const std::string& data, uint64_t length) {
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  return bytes + header + data;
}
std::string file_bytes(const std::string& header, const std::string& data) {
  return file_bytes(header, data, header.size());
}

// Two F32 values [1.5, -2] and three BF16 values [1, 2, 3].
const std::string kHeader = R"({"__metadata__":{"format":"pt"},)"
                            R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"BF16","shape":[1,3],"data_offsets":[8,14]}})";
const std::string kData =
    std::string("\x00\x00\xc0\x3f\x00\x00\x00\xc0", 8) + std::string("\x80\x3f\x00\x40\x40\x40", 6);

class Safetensors : public ::testing::Test {
 protected:
  Result<SafetensorsFile> open_bytes(const std::string& bytes) {
    testing::write_bytes(path(), bytes);
    return SafetensorsFile::open(path());
  }
  std::filesystem::path path() const { return dir_ / "w.safetensors"; }
  TempDir dir_;
};

TEST_F(Safetensors, ReadsTensorsAndMetadata) {
  Result<SafetensorsFile> file = open_bytes(file_bytes(kHeader, kData));
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(file->layout().metadata.at("format"), "pt");
  ASSERT_EQ(file->tensors().size(), 2u);
  TensorView a = file->tensor("a").value();
  EXPECT_EQ(a.dtype, DType::kF32);
  EXPECT_EQ(a.shape, std::vector<int64_t>{2});
  float values[2];
  std::memcpy(values, a.data, 8);
  EXPECT_EQ(values[0], 1.5f);
  EXPECT_EQ(values[1], -2.0f);
  TensorView b = file->tensor("b").value();
  EXPECT_EQ(b.shape, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(b.nbytes, 6u);
  uint16_t bits[3];
  std::memcpy(bits, b.data, 6);
  EXPECT_EQ(bf16_to_float(bits[2]), 3.0f);
  EXPECT_EQ(b.data, file->bytes().data() + 8 + kHeader.size() + 8);  // a view into the map
  expect_error_mentions(file->tensor("c").status(), {"'c'", path().string()});
}

TEST_F(Safetensors, ViewsOutliveTheFileObject) {
  TensorView a;
  {
    SafetensorsFile file = open_bytes(file_bytes(kHeader, kData)).value();
    a = file.tensor("a").value();
  }
  float first;
  std::memcpy(&first, a.data, 4);
  EXPECT_EQ(first, 1.5f);
}

TEST_F(Safetensors, EmptyHeaderAndZeroSizedTensorsAreValid) {
  EXPECT_TRUE(open_bytes(file_bytes("{}", "")).ok());
  Result<SafetensorsFile> file = open_bytes(file_bytes(
      R"({"e":{"dtype":"F16","shape":[0,4],"data_offsets":[0,0]},"s":{"dtype":"F16","shape":[],"data_offsets":[0,2]}})",
      std::string("\x00\x3c", 2)));
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(file->tensor("e")->numel(), 0);
  EXPECT_EQ(file->tensor("s")->numel(), 1);  // a scalar
}

TEST_F(Safetensors, RoundTripsTheWriter) {
  std::vector<SafetensorsEntry> entries(2);
  entries[0].name = "z";
  entries[0].dtype = DType::kBF16;
  entries[0].shape = {3};
  entries[1].name = "a";
  entries[1].dtype = DType::kF32;
  entries[1].shape = {2, 2};
  std::string header = encode_safetensors_header(entries, {{"k", "v"}});
  EXPECT_EQ(header.size() % 8, 0u);
  EXPECT_EQ(safetensors_data_bytes(entries), 22u);
  Result<SafetensorsFile> file = open_bytes(header + std::string(22, '\x01'));
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(file->find("z")->begin, 0u);  // packed in the given order
  EXPECT_EQ(file->find("a")->begin, 6u);
  EXPECT_EQ(file->layout().data_offset, header.size());
}

struct BadCase {
  const char* what;
  std::string bytes;
  std::vector<std::string> mentions;
};

TEST_F(Safetensors, RejectsDamageWithClearMessages) {
  const std::string full = file_bytes(kHeader, kData);
  std::vector<BadCase> cases = {
      {"empty file", "", {"truncated"}},
      {"short length", std::string("\x05\x00\x00", 3), {"truncated", "8-byte"}},
      {"truncated data", full.substr(0, full.size() - 3), {"'b'", "outside the data region"}},
      {"header past the end",
       file_bytes(kHeader, kData, 1u << 30),
       {"header length", "past the end"}},
      {"huge header length", file_bytes(kHeader, kData, ~uint64_t{0}), {"header length"}},
      {"malformed json", file_bytes("{\"a\":", ""), {"malformed JSON"}},
      {"not an object", file_bytes("[1,2]", ""), {"not a JSON object"}},
      {"unknown dtype",
       file_bytes(R"({"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})",
                  std::string(8, '\0')),
       {"'ids'", "I64"}},
      {"negative dim",
       file_bytes(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
                  std::string(4, '\0')),
       {"'t'", "shape dimension"}},
      {"missing shape",
       file_bytes(R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", std::string(4, '\0')),
       {"'t'", "'shape'"}},
      {"unordered offsets",
       file_bytes(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})",
                  std::string(4, '\0')),
       {"'t'", "not ordered"}},
      {"three offsets",
       file_bytes(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})",
                  std::string(8, '\0')),
       {"'t'", "data_offsets"}},
      {"size mismatch",
       file_bytes(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                  std::string(8, '\0')),
       {"'t'", "holds 8 bytes", "needs 12"}},
      {"overflowing shape",
       file_bytes(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                  std::string(8, '\0')),
       {"'t'", "too large"}},
      {"overlap",
       file_bytes(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
           std::string(12, '\0')),
       {"'a'", "'b'", "overlap"}},
      {"bad metadata", file_bytes(R"({"__metadata__":{"n":1}})", ""), {"__metadata__"}},
      {"entry not an object", file_bytes(R"({"t":3})", ""), {"'t'", "JSON object"}},
  };
  for (const BadCase& c : cases) {
    Result<SafetensorsFile> file = open_bytes(c.bytes);
    ASSERT_FALSE(file.ok()) << c.what;
    std::vector<std::string> mentions = c.mentions;
    mentions.push_back(path().string());
    for (const std::string& m : mentions) {
      EXPECT_NE(file.status().message().find(m), std::string::npos)
          << c.what << ": '" << file.status().message() << "' lacks '" << m << "'";
    }
  }
}

TEST_F(Safetensors, MissingFileIsNotFound) {
  Result<SafetensorsFile> file = SafetensorsFile::open(dir_ / "absent.safetensors");
  EXPECT_EQ(file.status().code(), StatusCode::kNotFound);
  expect_error_mentions(file.status(), {"absent.safetensors"});
}

}  // namespace
}  // namespace pdserve
