// Seeded random mutations of a small valid safetensors file and of its header: the reader must
// answer with a Status (or a valid layout whose views stay inside the file), never crash.
#include <chrono>
#include <random>

#include <gtest/gtest.h>

#include "common/model/safetensors.h"
#include "common/model/synthetic_checkpoint.h"
#include "tests/model/model_test_util.h"

namespace pdserve {
namespace {

std::string valid_file() {
  const std::string header = R"({"__metadata__":{"format":"pt"},)"
                             R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                             R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]},)"
                             R"("c":{"dtype":"F16","shape":[1],"data_offsets":[22,24]}})";
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  return bytes + header + std::string(24, '\x11');
}

// Tokens that steer mutations towards interesting header values.
const char* const kTokens[] = {"-1",
                               "0",
                               "18446744073709551615",
                               "9999999999",
                               "[",
                               "]",
                               "{",
                               "}",
                               "\"",
                               ",",
                               ":",
                               "null",
                               "\"I64\"",
                               "\"F32\"",
                               "[0,0]",
                               "1e400",
                               "\"__metadata__\"",
                               "\\u0000",
                               "[[[[",
                               "true"};

std::string mutate(std::string bytes, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % std::max<size_t>(n, 1)); };
  int edits = 1 + static_cast<int>(pick(4));
  for (int e = 0; e < edits; ++e) {
    switch (pick(6)) {
      case 0:  // flip a byte anywhere (including the length prefix)
        if (!bytes.empty()) bytes[pick(bytes.size())] ^= static_cast<char>(1 + pick(255));
        break;
      case 1:  // truncate
        bytes.resize(pick(bytes.size() + 1));
        break;
      case 2: {  // insert a token into the header region
        size_t at = std::min(bytes.size(), 8 + pick(bytes.size()));
        bytes.insert(at, kTokens[pick(std::size(kTokens))]);
        break;
      }
      case 3:  // delete a range
        if (!bytes.empty()) {
          size_t at = pick(bytes.size());
          bytes.erase(at, 1 + pick(8));
        }
        break;
      case 4:  // replace a digit with another
        for (int tries = 0; tries < 16 && !bytes.empty(); ++tries) {
          size_t at = pick(bytes.size());
          if (bytes[at] >= '0' && bytes[at] <= '9') {
            bytes[at] = static_cast<char>('0' + pick(10));
            break;
          }
        }
        break;
      default:  // rewrite the length prefix to a nearby or wild value
        if (bytes.size() >= 8) {
          uint64_t length = pick(2) ? bytes.size() - 8 + pick(9) - 4 : rng();
          for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((length >> (8 * i)) & 0xff);
        }
        break;
    }
  }
  return bytes;
}

TEST(SafetensorsFuzz, MutatedFilesGiveStatusNeverCrash) {
  const std::string original = valid_file();
  std::mt19937_64 rng(20261121);
  testing::TempDir dir;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  int iterations = 0, accepted = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    std::string bytes = mutate(original, rng);
    auto span = std::span(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size());
    Result<SafetensorsLayout> layout = parse_safetensors(span, "fuzz");
    if (layout.ok()) {
      ++accepted;
      for (const SafetensorsEntry& entry : layout->tensors) {
        ASSERT_LE(layout->data_offset + entry.end, bytes.size());
        ASSERT_LE(entry.begin, entry.end);
      }
    } else {
      ASSERT_FALSE(layout.status().message().empty());
      ASSERT_NE(layout.status().message().find("fuzz"), std::string::npos);
    }
    if (iterations % 64 == 0) {  // the file path through mmap too
      testing::write_bytes(dir / "f.safetensors", bytes);
      Result<SafetensorsFile> file = SafetensorsFile::open(dir / "f.safetensors");
      ASSERT_EQ(file.ok(), layout.ok());
    }
    ++iterations;
  }
  EXPECT_GT(iterations, 1000);
  EXPECT_GT(accepted, 0);  // the mutator also produces valid files: the check is not vacuous
  std::printf("fuzz: %d mutated files, %d accepted\n", iterations, accepted);
}

}  // namespace
}  // namespace pdserve
