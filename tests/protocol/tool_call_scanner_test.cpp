#include "common/protocol/tool_call_scanner.h"

#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/protocol/tool_call_parser.h"

namespace pdserve {
namespace {

// How far the scanner reads `body`: its length when it accepts every byte, else the offset of
// the byte it rejects.
size_t accepted_length(std::string_view body, ToolCallBodyScanner& scanner) {
  for (size_t i = 0; i < body.size(); ++i) {
    if (!scanner.consume(body[i])) return i;
  }
  return body.size();
}

const std::vector<std::string> kCallBodies = {
    "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n",
    R"({"arguments":{"x":[1,{"y":"}"}],"z":{}},"name":"g"})",
    R"( {"name": "\u0066\"", "arguments": {"a": [true, false, null, -0.5e-3, 0, 12, 1E+2]}} )",
    R"({"name": "météo", "arguments": {"s": "晴れ 🌧 \\ \/ \b\f\n\r\t \u00e9", "e": {}, "l": []}})",
    "{\"name\" : \"f\" ,\n \"arguments\" :\t{ \"k\" : [ ] } }",
};

TEST(ToolCallBodyScanner, AcceptsCallsAndFindsTheirNameAndArguments) {
  for (const std::string& body : kCallBodies) {
    const std::optional<ParsedToolCall> call = parse_tool_call(body);
    ASSERT_TRUE(call) << body;
    ToolCallBodyScanner scanner;
    ASSERT_EQ(accepted_length(body, scanner), body.size()) << body;
    EXPECT_TRUE(scanner.object_closed()) << body;
    EXPECT_EQ(scanner.name(), call->name);
    ASSERT_TRUE(scanner.arguments_begin() && scanner.arguments_end()) << body;
    EXPECT_EQ(body.substr(*scanner.arguments_begin(),
                          *scanner.arguments_end() - *scanner.arguments_begin()),
              call->arguments);
  }
}

TEST(ToolCallBodyScanner, RejectsAtTheFirstByteNoCallCanFollow) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      // {what it accepts, the byte it rejects and what follows}
      {"\n", "[{\"name\": \"f\"}]"},
      {R"({"name": "f", "arguments": {"a": )", "}}"},
      {R"({"name": "f", "arguments": {"a": 1}, "id)", R"(": 7})"},
      {R"({"name": "f", "arguments": {}, "name)", R"(": "g"})"},
      {R"({"name": )", "7, \"arguments\": {}}"},
      {R"({"name": ")", R"(", "arguments": {}})"},  // an empty name
      {R"({"name": "f", "arguments": )", R"("{}"})"},
      {R"({"name": "f", "arguments": {"a": [1)", R"(}})"},
      {R"({"name": "f", "arguments": {"a": 0)", R"(1}})"},
      {R"({"name": "f", "arguments": {"a": tru)", R"(}})"},
      {R"({"name": "f", "arguments": {"s": "\)", R"(q"}})"},
      {R"({"name": "f", "arguments": {"s": "\u12)", R"(x4"}})"},
      {R"({"name": "f", "arguments": {"s": ")", "\x01\"}}"},
      {R"({"arguments": {})", "}"},  // no name
      {R"({"name": "f", "arguments": {}} )", "x"},
      {"{\"name\": \"f\", \"arguments\": {\"a\": " + std::string(62, '['), "[]}"},  // too deep
  };
  for (const auto& [accepted, rest] : cases) {
    const std::string body = accepted + rest;
    const size_t rejected_at = accepted.size();
    ToolCallBodyScanner scanner;
    EXPECT_EQ(accepted_length(body, scanner), rejected_at) << body;
    EXPECT_TRUE(scanner.rejected()) << body;
    EXPECT_FALSE(scanner.consume(' ')) << "a rejection is final: " << body;
    EXPECT_FALSE(parse_tool_call(body)) << body;
  }
}

// The property the stream relies on: the scanner never rejects what the final parse accepts,
// and finds the same name and arguments; what it accepts whole the parse accepts too (the
// mutations below keep UTF-8 valid and make no lone surrogate: the scanner leaves both to the
// parse).
TEST(ToolCallBodyScanner, AgreesWithTheFinalParseOnMutatedCalls) {
  const std::string alphabet = "{}[]\":, \n0123456789.-+eEtrfalsn\\/x";
  std::mt19937 rng(20261126);
  int accepted_by_both = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string body = kCallBodies[rng() % kCallBodies.size()];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits && !body.empty(); ++e) {
      // Edits keep UTF-8 whole: only ASCII bytes change, nothing goes inside a sequence.
      const size_t at = rng() % body.size();
      if (static_cast<unsigned char>(body[at]) >= 0x80) continue;
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0:
          body[at] = c;
          break;
        case 1:
          body.insert(body.begin() + static_cast<std::ptrdiff_t>(at), c);
          break;
        default:
          body.erase(at, 1);
      }
    }
    const std::optional<ParsedToolCall> call = parse_tool_call(body);
    ToolCallBodyScanner scanner;
    const bool scanner_accepts =
        accepted_length(body, scanner) == body.size() && scanner.object_closed();
    ASSERT_EQ(scanner_accepts, call.has_value()) << testing::PrintToString(body);
    if (!call) continue;
    ++accepted_by_both;
    EXPECT_EQ(scanner.name(), call->name) << body;
    EXPECT_EQ(body.substr(*scanner.arguments_begin(),
                          *scanner.arguments_end() - *scanner.arguments_begin()),
              call->arguments)
        << body;
  }
  EXPECT_GT(accepted_by_both, 1000);
}

}  // namespace
}  // namespace pdserve
