#include <gtest/gtest.h>

#include "tests/tokenizer/test_support.h"

namespace pdserve::tokenizer_test {
namespace {

// Streams `ids` through a detokenizer; every piece must be valid UTF-8. Returns the whole text.
std::string stream(const std::vector<int32_t>& ids, bool skip_special) {
  IncrementalDetokenizer detokenizer(qwen3_tokenizer(), skip_special);
  std::string text;
  for (int32_t id : ids) {
    std::string piece = detokenizer.push(id).value();
    EXPECT_TRUE(is_valid_utf8(piece)) << "broken UTF-8 after id " << id;
    text += piece;
  }
  const std::string tail = detokenizer.flush();
  EXPECT_TRUE(is_valid_utf8(tail));
  return text + tail;
}

TEST(IncrementalDetokenizer, StreamEqualsOracleDecode) {
  for (const nlohmann::json& c : read_jsonl("decode.jsonl")) {
    EXPECT_EQ(stream(c["ids"].get<std::vector<int32_t>>(), c["skip_special"].get<bool>()),
              c["text"].get<std::string>())
        << c["ids"].dump();
  }
}

TEST(IncrementalDetokenizer, StreamEqualsDecodeOnGoldenEncodings) {
  for (const nlohmann::json& line : read_jsonl("golden.jsonl")) {
    const auto ids = line["ids"].get<std::vector<int32_t>>();
    for (bool skip : {false, true}) {
      EXPECT_EQ(stream(ids, skip), qwen3_tokenizer().decode(ids, skip).value())
          << line["text"].dump();
    }
  }
}

TEST(IncrementalDetokenizer, HoldsBackAPartialCharacter) {
  const Tokenizer& tokenizer = qwen3_tokenizer();
  // U+1F600 is F0 9F 98 80; in the GPT-2 byte alphabet those bytes are written U+00F0,
  // U+0141, U+013A and U+0122. Fed as four byte tokens, nothing comes out before the last.
  const std::string emoji = "\xF0\x9F\x98\x80";
  std::vector<int32_t> byte_ids;
  for (const char* token : {"\xC3\xB0", "\xC5\x81", "\xC4\xBA", "\xC4\xA2"}) {
    byte_ids.push_back(tokenizer.token_to_id(token).value());
  }
  IncrementalDetokenizer detokenizer(tokenizer);
  ASSERT_EQ(byte_ids.size(), 4u);
  EXPECT_EQ(detokenizer.push(byte_ids[0]).value(), "");
  EXPECT_EQ(detokenizer.push(byte_ids[1]).value(), "");
  EXPECT_EQ(detokenizer.push(byte_ids[2]).value(), "");
  EXPECT_EQ(detokenizer.push(byte_ids[3]).value(), emoji);
  // An unfinished character at the end of a stream becomes U+FFFD.
  EXPECT_EQ(detokenizer.push(byte_ids[0]).value(), "");
  EXPECT_EQ(detokenizer.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(detokenizer.flush(), "");
}

TEST(IncrementalDetokenizer, UnknownIdIsAnErrorAndChangesNothing) {
  const Tokenizer& tokenizer = qwen3_tokenizer();
  IncrementalDetokenizer detokenizer(tokenizer);
  const std::vector<int32_t> ids = tokenizer.encode("\xE4\xBD\xA0").value();  // 你
  Result<std::string> bad = detokenizer.push(-5);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  std::string text;
  for (int32_t id : ids) text += detokenizer.push(id).value();
  EXPECT_EQ(text + detokenizer.flush(), "\xE4\xBD\xA0");
}

}  // namespace
}  // namespace pdserve::tokenizer_test
