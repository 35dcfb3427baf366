// Parity with Hugging Face's tokenizers on the committed goldens,
// tests/data/tokenizer/{golden,decode}.jsonl (tools/oracle/gen_tokenizer_golden.py); the live
// comparison on fresh strings is hf_tokenizer_oracle_test.py.
#include <gtest/gtest.h>

#include "tests/tokenizer/test_support.h"

namespace pdserve::tokenizer_test {
namespace {

constexpr int kMaxReported = 10;  // failures printed per test, to keep the log readable

TEST(TokenizerGolden, KnownSentences) {
  const Tokenizer& tokenizer = qwen3_tokenizer();
  EXPECT_EQ(tokenizer.encode("Explain KV cache in one sentence.").value(),
            (std::vector<int32_t>{840, 20772, 84648, 6500, 304, 825, 11652, 13}));
  EXPECT_EQ(tokenizer.encode("Hello world").value(), (std::vector<int32_t>{9707, 1879}));
}

TEST(TokenizerGolden, EncodeMatchesOracleOnEveryLine) {
  const Tokenizer& tokenizer = qwen3_tokenizer();
  const std::vector<nlohmann::json> lines = read_jsonl("golden.jsonl");
  ASSERT_GE(lines.size(), 2000u);
  int failures = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& text = lines[i]["text"].get_ref<const std::string&>();
    const auto expected = lines[i]["ids"].get<std::vector<int32_t>>();
    Result<std::vector<int32_t>> ids = tokenizer.encode(text);
    if (!ids.ok() || *ids != expected) {
      if (++failures <= kMaxReported) {
        ADD_FAILURE() << "golden.jsonl line " << i + 1 << " "
                      << nlohmann::json(shorten(text)).dump() << ": "
                      << (ids.ok() ? nlohmann::json(*ids).dump() : ids.status().to_string())
                      << " != " << nlohmann::json(expected).dump();
      }
    }
  }
  EXPECT_EQ(failures, 0) << "of " << lines.size() << " lines";
}

TEST(TokenizerGolden, DecodeOfEncodeIsNfcOfText) {
  const Tokenizer& tokenizer = qwen3_tokenizer();
  int failures = 0;
  for (const nlohmann::json& line : read_jsonl("golden.jsonl")) {
    const std::string& text = line["text"].get_ref<const std::string&>();
    const std::string& nfc = line["nfc"].get_ref<const std::string&>();
    Result<std::string> round_trip = tokenizer.decode(tokenizer.encode(text).value());
    if (!round_trip.ok() || *round_trip != nfc) {
      if (++failures <= kMaxReported)
        ADD_FAILURE() << "round trip of " << nlohmann::json(shorten(text)).dump();
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(TokenizerGolden, DecodeMatchesOracle) {
  const Tokenizer& tokenizer = qwen3_tokenizer();
  const std::vector<nlohmann::json> cases = read_jsonl("decode.jsonl");
  ASSERT_GE(cases.size(), 1000u);
  int failures = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto ids = cases[i]["ids"].get<std::vector<int32_t>>();
    Result<std::string> text = tokenizer.decode(ids, cases[i]["skip_special"].get<bool>());
    if (!text.ok() || *text != cases[i]["text"].get<std::string>()) {
      if (++failures <= kMaxReported) {
        ADD_FAILURE() << "decode.jsonl line " << i + 1 << " " << cases[i]["ids"].dump() << ": "
                      << (text.ok() ? nlohmann::json(*text).dump() : text.status().to_string());
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace pdserve::tokenizer_test
