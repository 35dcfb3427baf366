// Helpers shared by the tokenizer tests: the vendored Qwen3 tokenizer (loaded once per process),
// golden-file reading, and a UTF-8 validity check written independently of the library's.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/tokenizer/tokenizer.h"

namespace pdserve::tokenizer_test {

inline const Tokenizer& qwen3_tokenizer() {
  static const Tokenizer tokenizer = [] {
    Result<Tokenizer> loaded = Tokenizer::from_model_dir(PDSERVE_ASSETS_DIR "/qwen3-tokenizer");
    if (!loaded.ok()) {
      ADD_FAILURE() << loaded.status().to_string();
      std::abort();
    }
    return std::move(loaded).value();
  }();
  return tokenizer;
}

inline std::vector<nlohmann::json> read_jsonl(const std::string& name) {
  std::ifstream in(std::string(PDSERVE_TEST_DATA_DIR) + "/tokenizer/" + name);
  EXPECT_TRUE(in) << "cannot open " << name;
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

// Offset of the first byte that is not well-formed UTF-8 per the Unicode standard's table of
// byte ranges (Table 3-7), or nullopt.
inline std::optional<size_t> first_invalid_utf8(std::string_view s) {
  struct Row {
    uint8_t lead_lo, lead_hi, second_lo, second_hi;
    int length;
  };
  static constexpr Row kRows[] = {
      {0x00, 0x7F, 0, 0, 1},       {0xC2, 0xDF, 0x80, 0xBF, 2}, {0xE0, 0xE0, 0xA0, 0xBF, 3},
      {0xE1, 0xEC, 0x80, 0xBF, 3}, {0xED, 0xED, 0x80, 0x9F, 3}, {0xEE, 0xEF, 0x80, 0xBF, 3},
      {0xF0, 0xF0, 0x90, 0xBF, 4}, {0xF1, 0xF3, 0x80, 0xBF, 4}, {0xF4, 0xF4, 0x80, 0x8F, 4},
  };
  size_t i = 0;
  while (i < s.size()) {
    const auto lead = static_cast<uint8_t>(s[i]);
    const Row* row = nullptr;
    for (const Row& candidate : kRows) {
      if (lead >= candidate.lead_lo && lead <= candidate.lead_hi) row = &candidate;
    }
    if (row == nullptr || i + row->length > s.size()) return i;
    for (int k = 1; k < row->length; ++k) {
      const auto byte = static_cast<uint8_t>(s[i + k]);
      const uint8_t lo = k == 1 ? row->second_lo : 0x80;
      const uint8_t hi = k == 1 ? row->second_hi : 0xBF;
      if (byte < lo || byte > hi) return i;
    }
    i += row->length;
  }
  return std::nullopt;
}

inline bool is_valid_utf8(std::string_view s) {
  return !first_invalid_utf8(s).has_value();
}

inline std::string shorten(std::string_view text) {
  return text.size() <= 80 ? std::string(text) : std::string(text.substr(0, 80)) + "...";
}

}  // namespace pdserve::tokenizer_test
