// The U+FFFD policy of the decoders: one replacement per maximal invalid subpart (the Unicode
// standard's "best practice", section 3.9, also used by the WHATWG decoder and Rust).
#include "common/tokenizer/utf8.h"

#include <gtest/gtest.h>

namespace pdserve::tokenizer_detail {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

std::string lossy(std::string_view bytes) {
  std::string out;
  EXPECT_EQ(append_utf8_lossy(bytes, out, false), bytes.size());
  return out;
}

TEST(Utf8, ValidTextIsUnchanged) {
  const std::string text = "a\xC3\xA9\xE4\xBD\xA0\xF0\x9F\x98\x80";  // a é 你 😀
  EXPECT_EQ(lossy(text), text);
  EXPECT_EQ(find_invalid_utf8(text), std::nullopt);
}

TEST(Utf8, MaximalSubpartsFromTheUnicodeStandard) {
  // Table 3-8 of the Unicode standard: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64.
  EXPECT_EQ(lossy("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a" + kFffd + kFffd + kFffd + "b" + kFffd + "c" + kFffd + kFffd + "d");
  EXPECT_EQ(lossy("\xC0\xAF"), kFffd + kFffd);                          // overlong
  EXPECT_EQ(lossy("\xED\xA0\x80"), kFffd + kFffd + kFffd);              // surrogate
  EXPECT_EQ(lossy("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // above U+10FFFF
  EXPECT_EQ(lossy("\xE4\xBD"), kFffd);                                  // cut short
  EXPECT_EQ(lossy("\xE4\xBD"
                  "a"),
            kFffd + "a");
}

TEST(Utf8, IncompleteTailIsKept) {
  std::string out;
  EXPECT_EQ(append_utf8_lossy("ab\xF0\x9F\x98", out, true), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(append_utf8_lossy("\xFF\xF0\x9F", out, true), 1u);  // the FF can never be completed
  EXPECT_EQ(out, kFffd);
}

TEST(Utf8, FirstInvalidOffset) {
  EXPECT_EQ(find_invalid_utf8("abcdefghij\xFF"), 10u);
  EXPECT_EQ(find_invalid_utf8("\xC3\xA9\xC3"), 2u);
  EXPECT_EQ(find_invalid_utf8("ok\xED\xBF\xBF"), 2u);
  EXPECT_EQ(find_invalid_utf8(std::string_view("a\0b", 3)), std::nullopt);  // NUL is valid
}

}  // namespace
}  // namespace pdserve::tokenizer_detail
