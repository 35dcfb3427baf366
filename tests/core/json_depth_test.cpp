// The JSON nesting limit shared by every server: counted before parsing, strings ignored.
#include "common/core/json_depth.h"

#include <gtest/gtest.h>

#include <string>

namespace pdserve {
namespace {

std::string nested(int levels) {
  return std::string(levels, '[') + std::string(levels, ']');
}

TEST(JsonDepthTest, AllowsTheLimitAndRefusesOneLevelMoreNamingTheByte) {
  EXPECT_TRUE(check_json_depth(nested(kMaxJsonDepth), "body").ok());
  const Status deeper = check_json_depth("{\"a\": " + nested(kMaxJsonDepth), "the body");
  ASSERT_FALSE(deeper.ok());
  EXPECT_EQ(deeper.code(), StatusCode::kInvalidArgument);
  // '{' is level 1, so level 65 is the 64th '[' at byte 6 + 63.
  EXPECT_EQ(deeper.message(), "the body nests deeper than 64 levels (at byte 69)");
  // Siblings do not add up: depth, not count.
  std::string siblings = "[";
  for (int i = 0; i < 1000; ++i) siblings += nested(kMaxJsonDepth - 1) + ",";
  siblings += "0]";
  EXPECT_TRUE(check_json_depth(siblings, "body").ok());
}

TEST(JsonDepthTest, BracketsInsideStringsDoNotCount) {
  const std::string quoted = "{\"a\": \"\\\"" + std::string(1000, '[') + "\\\\\"}";
  EXPECT_TRUE(check_json_depth(quoted, "body").ok());
  // After the string closes, brackets count again.
  EXPECT_FALSE(check_json_depth("[\"x\\\"\"," + nested(kMaxJsonDepth) + "]", "body").ok());
}

TEST(JsonDepthTest, ParseJsonBoundedChecksDepthThenSyntax) {
  Result<nlohmann::json> ok = parse_json_bounded(R"({"a": [1, {"b": null}]})", "answer");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)["a"][1]["b"], nullptr);
  Result<nlohmann::json> deep = parse_json_bounded(nested(500'000), "answer");
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("answer nests deeper"), std::string::npos);
  Result<nlohmann::json> malformed = parse_json_bounded("{\"a\": }", "answer");
  ASSERT_FALSE(malformed.ok());
  EXPECT_EQ(malformed.status().message(), "answer is not valid JSON");
}

}  // namespace
}  // namespace pdserve
