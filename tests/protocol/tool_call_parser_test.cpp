#include "common/protocol/tool_call_parser.h"

#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace pdserve {
namespace {

// What Qwen3 writes for a call: the template's own format.
std::string call_block(std::string_view name, std::string_view arguments) {
  return "<tool_call>\n{\"name\": \"" + std::string(name) +
         "\", \"arguments\": " + std::string(arguments) + "}\n</tool_call>";
}

struct Streamed {
  std::string content;
  std::vector<ParsedToolCall> calls;
};

void append(Streamed& out, ToolCallDelta delta) {
  out.content += delta.content;
  for (ParsedToolCall& call : delta.calls) out.calls.push_back(std::move(call));
}

Streamed stream(const std::vector<std::string_view>& pieces) {
  ToolCallParser parser;
  Streamed out;
  for (std::string_view piece : pieces) append(out, parser.push(piece));
  append(out, parser.finish());
  EXPECT_EQ(parser.num_calls(), static_cast<int>(out.calls.size()));
  return out;
}

void expect_split(std::string_view text, std::string_view content,
                  const std::vector<ParsedToolCall>& calls) {
  ToolCallDelta split = split_tool_calls(text);
  EXPECT_EQ(split.content, content) << text;
  EXPECT_EQ(split.calls, calls) << text;
}

// The texts of the tests below, for the streaming properties.
std::vector<std::string> corpus() {
  return {
      "I'll check the weather.\n\n" + call_block("get_weather", R"({"city": "Paris"})"),
      call_block("get_weather", R"({"city": "Oslo", "unit": "celsius"})") + "\n" +
          call_block("get_time", "{}") + "\n",
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, {\"b\": "
      "\"}\\\"]\"}]}}\n</tool_call>",
      "<tool_call>{\"arguments\":{\"x\":1},\"name\":\"g\"}</tool_call>after",
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call> then text",
      "text <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
      "a < b and <tool_ca",
      "<tool_call>[1, 2]</tool_call><tool_call></tool_call>" + call_block("k", "{\"v\": \"€\"}"),
      "no calls at all, just\ntext with </tool_call> and <tool_call",
  };
}

TEST(ToolCallParser, SplitsTextBeforeACall) {
  expect_split(corpus()[0], "I'll check the weather.\n\n",
               {{"get_weather", R"({"city": "Paris"})"}});
}

TEST(ToolCallParser, SeveralCallsDropTheWhitespaceBetweenThem) {
  expect_split(corpus()[1], "",
               {{"get_weather", R"({"city": "Oslo", "unit": "celsius"})"}, {"get_time", "{}"}});
}

TEST(ToolCallParser, ArgumentsKeepTheModelsBytes) {
  // Brackets and quotes inside strings, nesting, members in either order, no spaces.
  expect_split(corpus()[2], "", {{"f", R"({"a": [1, {"b": "}\"]"}]})"}});
  expect_split(corpus()[3], "after", {{"g", R"({"x":1})"}});
  expect_split(call_block("\\u0066", R"({"s": "caf\u00e9 ☕"})"), "",
               {{"f", R"({"s": "caf\u00e9 ☕"})"}});
}

TEST(ToolCallParser, MalformedCallsStayContentByteForByte) {
  const std::vector<std::string> malformed = {
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>",  // bad JSON
      "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",                           // no arguments
      "<tool_call>\n{\"arguments\": {}}\n</tool_call>",                         // no name
      "<tool_call>\n{\"name\": \"\", \"arguments\": {}}\n</tool_call>",         // empty name
      "<tool_call>\n{\"name\": 7, \"arguments\": {}}\n</tool_call>",            // name not a string
      "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{}\"}\n</tool_call>",    // string arguments
      "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>",       // array arguments
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {}, \"id\": 1}\n</tool_call>",        // extra
      "<tool_call>\n{\"name\": \"f\", \"name\": \"g\", \"arguments\": {}}\n</tool_call>",  // twice
      "<tool_call>\n[{\"name\": \"f\", \"arguments\": {}}]\n</tool_call>",  // not an object
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {}} trailing\n</tool_call>",
      "<tool_call></tool_call>",
      "<tool_call>\n{\"name\": \"f\", \"arguments\": " + std::string(100, '[') +
          std::string(100, ']') + "}\n</tool_call>",  // nests too deep
  };
  for (const std::string& block : malformed) {
    expect_split(block, block, {});
    expect_split("Before " + block + " after", "Before " + block + " after", {});
  }
  // One malformed block does not spoil the valid ones around it.
  const std::string bad = "<tool_call>{oops}</tool_call>";
  expect_split(call_block("a", "{}") + "\n" + bad + "\n" + call_block("b", "{}"), bad + "\n",
               {{"a", "{}"}, {"b", "{}"}});
  expect_split(corpus()[4], corpus()[4], {});
}

TEST(ToolCallParser, AnUnterminatedCallAtTheEndIsContent) {
  expect_split(corpus()[5], corpus()[5], {});
  expect_split(call_block("a", "{}") + "\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}",
               "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}", {{"a", "{}"}});
  // A partial start tag at the end, and tags that open nothing, are plain text.
  expect_split(corpus()[6], corpus()[6], {});
  expect_split(corpus()[8], corpus()[8], {});
}

TEST(ToolCallParser, AnEndTagInsideAStringEndsTheBlock) {
  // As in vLLM's parser, the first "</tool_call>" closes the block; the JSON is then cut short.
  const std::string text =
      R"(<tool_call>{"name": "f", "arguments": {"s": "</tool_call>"}}</tool_call>)";
  expect_split(text, text, {});
}

TEST(ToolCallParser, ArgumentsAreValidJsonObjects) {
  for (const std::string& text : corpus()) {
    for (const ParsedToolCall& call : split_tool_calls(text).calls) {
      const nlohmann::json arguments = nlohmann::json::parse(call.arguments, nullptr, false);
      EXPECT_TRUE(arguments.is_object()) << call.arguments;
    }
  }
}

// Cut at every byte boundary (and into single bytes): the pieces concatenate to the split.
TEST(ToolCallParser, StreamedPiecesConcatenateToTheWholeSplitAtEveryCut) {
  for (const std::string& text : corpus()) {
    const ToolCallDelta whole = split_tool_calls(text);
    for (size_t cut = 0; cut <= text.size(); ++cut) {
      const std::string_view view = text;
      const Streamed two = stream({view.substr(0, cut), view.substr(cut)});
      EXPECT_EQ(two.content, whole.content) << text << " cut at " << cut;
      EXPECT_EQ(two.calls, whole.calls) << text << " cut at " << cut;
    }
    std::vector<std::string_view> bytes;
    for (size_t i = 0; i < text.size(); ++i) bytes.push_back(std::string_view(text).substr(i, 1));
    const Streamed single = stream(bytes);
    EXPECT_EQ(single.content, whole.content) << text;
    EXPECT_EQ(single.calls, whole.calls) << text;
  }
}

// What has gone out after a prefix depends on the prefix only, not on how it was cut: a
// resumed stream replays the delivered text in one piece and must stand where the first node
// stood.
TEST(ToolCallParser, EmittedOutputAfterAPrefixDoesNotDependOnItsPieces) {
  for (const std::string& text : corpus()) {
    ToolCallParser bytewise;
    Streamed by_byte;
    for (size_t end = 1; end <= text.size(); ++end) {
      append(by_byte, bytewise.push(std::string_view(text).substr(end - 1, 1)));
      ToolCallParser replay;
      Streamed at_once;
      append(at_once, replay.push(std::string_view(text).substr(0, end)));
      ASSERT_EQ(at_once.content, by_byte.content) << text << " prefix " << end;
      ASSERT_EQ(at_once.calls, by_byte.calls) << text << " prefix " << end;
      ASSERT_EQ(replay.num_calls(), bytewise.num_calls());
    }
  }
}

TEST(ToolCallParser, RandomMixturesStreamLikeTheirWholeSplit) {
  const std::vector<std::string> fragments = {"<tool_call>",
                                              "</tool_call>",
                                              "\n",
                                              " ",
                                              "text",
                                              "<",
                                              "<tool",
                                              "{",
                                              "}",
                                              "\"",
                                              R"({"name": "f", "arguments": {"k": "v"}})",
                                              R"({"name": "g", "arguments": {}})",
                                              call_block("h", R"({"n": [1, 2.5e3, null, true]})"),
                                              "é"};
  std::mt19937 rng(20261125);
  for (int round = 0; round < 2000; ++round) {
    std::string text;
    const int count = static_cast<int>(rng() % 12);
    for (int i = 0; i < count; ++i) text += fragments[rng() % fragments.size()];
    std::vector<std::string_view> pieces;
    for (size_t at = 0; at < text.size();) {
      const size_t length = std::min<size_t>(1 + rng() % 8, text.size() - at);
      pieces.push_back(std::string_view(text).substr(at, length));
      at += length;
    }
    const ToolCallDelta whole = split_tool_calls(text);
    const Streamed streamed = stream(pieces);
    ASSERT_EQ(streamed.content, whole.content) << text;
    ASSERT_EQ(streamed.calls, whole.calls) << text;
    // Content and calls account for the whole text but for tags and dropped whitespace.
    size_t accounted = whole.content.size();
    for (const ParsedToolCall& call : whole.calls) accounted += call.arguments.size();
    ASSERT_LE(accounted, text.size()) << text;
  }
}

}  // namespace
}  // namespace pdserve
