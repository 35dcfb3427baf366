// JavaScript-compatible text helpers: number formatting against values printed by Node
// (String(x)), a round-trip property over random doubles, and UTF-16 / whitespace semantics.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "common/chat/jinja_text.h"

namespace pdserve::jinja {
namespace {

TEST(JinjaText, NumberToStringMatchesJavaScript) {
  // Expected strings printed by Node 20's String(x).
  const std::pair<double, const char*> cases[] = {
      {0.1, "0.1"},
      {1.0 / 3, "0.3333333333333333"},
      {1e21, "1e+21"},
      {1e-7, "1e-7"},
      {123456789.125, "123456789.125"},
      {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
      {-2.5e-6, "-0.0000025"},
      {100, "100"},
      {1e20, "100000000000000000000"},
      {0.000001, "0.000001"},
      {9007199254740994.0, "9007199254740994"},
      {-0.0001234, "-0.0001234"},
      {-0.0, "0"},
      {NAN, "NaN"},
      {-INFINITY, "-Infinity"},
  };
  for (const auto& [value, expected] : cases)
    EXPECT_EQ(js_number_to_string(value), expected) << value;
}

// Expected strings: Python 3.11's repr() of the same doubles.
TEST(JinjaText, PythonFloatReprMatchesPython) {
  const std::pair<double, const char*> cases[] = {
      {0.1, "0.1"},
      {1.0 / 3, "0.3333333333333333"},
      {1e16, "1e+16"},
      {1e15, "1000000000000000.0"},
      {123456789.125, "123456789.125"},
      {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
      {-2.5e-6, "-2.5e-06"},
      {100.0, "100.0"},
      {0.0001, "0.0001"},
      {0.00001, "1e-05"},
      {-0.0, "-0.0"},
      {9007199254740992.0, "9007199254740992.0"},
      {1e22, "1e+22"},
      {-1.5e-5, "-1.5e-05"},
      {12345.678, "12345.678"},
  };
  for (const auto& [value, expected] : cases) EXPECT_EQ(python_float_repr(value), expected) << value;
}

TEST(JinjaText, NumberToStringRoundTripsRandomDoubles) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    uint64_t bits = rng();
    double value;
    std::memcpy(&value, &bits, sizeof(value));
    if (!std::isfinite(value)) continue;
    std::string text = js_number_to_string(value);
    EXPECT_EQ(std::strtod(text.c_str(), nullptr), value) << text;
  }
}

TEST(JinjaText, Utf16LengthCountsSurrogatePairs) {
  EXPECT_EQ(utf16_length("abc"), 3u);
  EXPECT_EQ(utf16_length("h\xC3\xA9llo"), 5u);      // é is one unit
  EXPECT_EQ(utf16_length("\xF0\x9F\x98\x80"), 2u);  // 😀 is a surrogate pair
  std::string unit;
  ASSERT_TRUE(
      utf16_unit_at("a\xF0\x9F\x98\x80"
                    "b",
                    3, unit));
  EXPECT_EQ(unit, "b");
  ASSERT_TRUE(
      utf16_unit_at("a\xF0\x9F\x98\x80"
                    "b",
                    1, unit));
  EXPECT_EQ(unit, "\xEF\xBF\xBD");  // half of a pair
  EXPECT_FALSE(utf16_unit_at("ab", 2, unit));
  ASSERT_TRUE(utf16_unit_at("ab", -1, unit));
  EXPECT_EQ(unit, "b");
}

TEST(JinjaText, TrimUsesJavaScriptWhitespace) {
  // NBSP, ideographic space and BOM are whitespace to String#trim; ZWSP (U+200B) is not.
  EXPECT_EQ(js_trim("\xC2\xA0\xE3\x80\x80 x \xEF\xBB\xBF\n"), "x");
  EXPECT_EQ(js_trim("\xE2\x80\x8Bx"), "\xE2\x80\x8Bx");
  EXPECT_EQ(js_trim_start("  a "), "a ");
  EXPECT_EQ(js_trim_end("  a \t"), "  a");
}

TEST(JinjaText, CaseMappingAndTitle) {
  EXPECT_EQ(to_upper("abc \xC3\xA9 \xD0\xB4"), "ABC \xC3\x89 \xD0\x94");
  EXPECT_EQ(to_lower("\xC3\x89T\xC3\x89"), "\xC3\xA9t\xC3\xA9");
  // /\b\w/g: only ASCII word starts change, the rest is kept as is.
  EXPECT_EQ(title_case_ascii_words("hello wORLD-foo_bar 3x \xC3\xA9"
                                   "a"),
            "Hello WORLD-Foo_bar 3x \xC3\xA9"
            "A");
  EXPECT_EQ(capitalize_first("\xC3\xA9t\xC3\xA9 X"), "\xC3\x89t\xC3\xA9 X");
}

TEST(JinjaText, StringToNumberFollowsLooseEquality) {
  EXPECT_EQ(js_string_to_number(" 12 "), 12);
  EXPECT_EQ(js_string_to_number(""), 0);
  EXPECT_EQ(js_string_to_number("0x1f"), 31);
  EXPECT_EQ(js_string_to_number("1e3"), 1000);
  EXPECT_TRUE(std::isnan(js_string_to_number("12abc")));
  double value = 0;
  ASSERT_TRUE(js_parse_int("  -42px", value));
  EXPECT_EQ(value, -42);
  EXPECT_FALSE(js_parse_int("px", value));
  ASSERT_TRUE(js_parse_float("3.5e2x", value));
  EXPECT_EQ(value, 350);
}

}  // namespace
}  // namespace pdserve::jinja
