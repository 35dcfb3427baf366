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

// What a client accumulates from a stream: the content, the calls it was told about (each
// announced with its name, then its argument fragments concatenated), and the completed calls.
struct Streamed {
  std::string content;
  std::vector<ParsedToolCall> announced;
  std::vector<ParsedToolCall> calls;
};

void append(Streamed& out, ToolCallDelta delta) {
  out.content += delta.content;
  for (ToolCallFragment& fragment : delta.fragments) {
    const size_t index = static_cast<size_t>(fragment.index);
    if (fragment.name) {
      ASSERT_EQ(index, out.announced.size()) << "calls are announced in index order";
      out.announced.push_back({*fragment.name, ""});
    } else {
      ASSERT_EQ(index + 1, out.announced.size()) << "fragments follow the last announced call";
      EXPECT_FALSE(fragment.arguments.empty()) << "only an announcement may carry no arguments";
    }
    out.announced[index].arguments += fragment.arguments;
  }
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

// The completed calls are announced calls, in order, with all their arguments; the others are
// calls whose block turned out not to be one after its name went out.
bool completed_calls_were_announced(const std::vector<ParsedToolCall>& calls,
                                    const std::vector<ParsedToolCall>& announced) {
  size_t next = 0;
  for (const ParsedToolCall& call : announced) {
    if (next < calls.size() && call == calls[next]) ++next;
  }
  return next == calls.size();
}

// The stream accumulates to the whole answer: same content, same calls.
void expect_streams_like_whole(const Streamed& streamed, const ToolCallDelta& whole,
                               std::string_view what) {
  EXPECT_EQ(streamed.content, whole.content) << what;
  EXPECT_EQ(streamed.calls, whole.calls) << what;
  EXPECT_TRUE(completed_calls_were_announced(whole.calls, streamed.announced)) << what;
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
      // Non-ASCII (2-, 3- and 4-byte sequences), nesting, and strings holding brackets and
      // tag-like text.
      call_block("météo",
                 R"({"ville": "Zürich", "note": "晴れ ☀", "emoji": "🌧", "n": [[{}], []]})"),
      call_block("f", R"({"s": "a } b ] {", "t": "</tool_cal", "u": "<tool_call>", "v": "\\\"}"})"),
      // Blocks that stop being calls after their name went out: bad JSON in the arguments,
      // another member after them, a lone surrogate (only the final parse sees it), then a call.
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }}\n</tool_call>\n" +
          call_block("g", R"({"b": -1.5e+3})"),
      "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"id\": 7}\n</tool_call>" +
          call_block("f", R"({"s": "\ud800"})") + call_block("g", "{}"),
  };
}

// The calls of a text as parse_tool_call judges each block on its own (independent of the
// incremental parser's scanner): the first "</tool_call>" after a "<tool_call>" ends its block.
std::vector<ParsedToolCall> reference_split_calls(std::string_view text) {
  std::vector<ParsedToolCall> calls;
  for (size_t start = text.find(kToolCallStart); start != std::string_view::npos;
       start = text.find(kToolCallStart, start)) {
    const size_t body = start + kToolCallStart.size();
    const size_t end = text.find(kToolCallEnd, body);
    if (end == std::string_view::npos) break;
    if (auto call = parse_tool_call(text.substr(body, end - body))) calls.push_back(*call);
    start = end + kToolCallEnd.size();
  }
  return calls;
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
      expect_streams_like_whole(two, whole, text + " cut at " + std::to_string(cut));
    }
    std::vector<std::string_view> bytes;
    for (size_t i = 0; i < text.size(); ++i) bytes.push_back(std::string_view(text).substr(i, 1));
    expect_streams_like_whole(stream(bytes), whole, text);
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
      ASSERT_EQ(at_once.announced, by_byte.announced) << text << " prefix " << end;
      ASSERT_EQ(at_once.calls, by_byte.calls) << text << " prefix " << end;
      ASSERT_EQ(replay.num_calls(), bytewise.num_calls());
    }
  }
}

// A text of content and calls, and where each call's parts lie in it.
struct ScriptedCall {
  std::string name, arguments;
  size_t body_begin = 0;       // just past its "<tool_call>"
  size_t name_end = 0;         // just past the closing quote of its name
  size_t arguments_begin = 0;  // its arguments' '{'
};
struct Script {
  std::string text;
  std::vector<ScriptedCall> calls;

  Script& content(std::string_view text_piece) {
    text += text_piece;
    return *this;
  }
  // A call as the model writes it, with the name or the arguments first, and the whitespace
  // around its object.
  Script& call(std::string_view name, std::string_view arguments, bool arguments_first = false,
               std::string_view space = "\n") {
    ScriptedCall call{std::string(name), std::string(arguments)};
    text += kToolCallStart;
    call.body_begin = text.size();
    text += space;
    const std::string name_json = nlohmann::json(name).dump();
    if (arguments_first) {
      text += "{\"arguments\": ";
      call.arguments_begin = text.size();
      text += std::string(arguments) + ", \"name\": " + name_json;
      call.name_end = text.size();
    } else {
      text += "{\"name\": " + name_json;
      call.name_end = text.size();
      text += ", \"arguments\": ";
      call.arguments_begin = text.size();
      text += arguments;
    }
    text += "}" + std::string(space) + std::string(kToolCallEnd);
    calls.push_back(std::move(call));
    return *this;
  }
};

bool is_valid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const size_t length = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
    if (i + length > text.size()) return false;
    for (size_t k = 1; k < length; ++k) {
      if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return false;
    }
    i += length;
  }
  return true;
}

// What a stream must have sent of `call` once it has read the first `read` bytes of the script:
// nothing before the name's closing quote, then every byte of the arguments read, but for a
// possible partial "</tool_call>" at the end (it may end the block) and a cut UTF-8 sequence.
std::optional<std::string> arguments_due(const Script& script, const ScriptedCall& call,
                                         size_t read) {
  if (read <= call.body_begin) return std::nullopt;
  const std::string_view body =
      std::string_view(script.text).substr(call.body_begin, read - call.body_begin);
  size_t possible_end_tag = 0;
  for (size_t length = 1; length < kToolCallEnd.size() && length <= body.size(); ++length) {
    if (body.ends_with(kToolCallEnd.substr(0, length))) possible_end_tag = length;
  }
  const size_t judged = read - possible_end_tag;
  if (judged < call.name_end) return std::nullopt;
  std::string_view sent =
      std::string_view(script.text)
          .substr(call.arguments_begin,
                  std::min(std::max(judged, call.arguments_begin) - call.arguments_begin,
                           call.arguments.size()));
  while (!is_valid_utf8(sent)) sent.remove_suffix(1);
  return std::string(sent);
}

std::vector<Script> realistic_scripts() {
  std::vector<Script> scripts(5);
  // What Qwen3 writes (json.dumps spacing), text first, two calls.
  scripts[0]
      .content("Let me look both up.\n\n")
      .call("get_weather", R"({"city": "Paris", "unit": "celsius", "days": 2})")
      .content("\n")
      .call("get_time", R"({"timezone": "Europe/Paris"})");
  // Nesting, numbers, literals, escapes, and strings holding brackets and tag-like text.
  scripts[1].call("search",
                  R"({"filter": {"tags": ["a", "b}"], "range": [1, 2.5e3, -0.5E-2, 0]}, )"
                  R"("ok": true, "none": null, "q": "say \"hi\"\\n </tool_cal <tool_call> {]"})");
  // Non-ASCII, in the name and the arguments: 2-, 3- and 4-byte sequences, and \u escapes.
  scripts[2].call(
      "météo", R"({"ville": "Zürich", "note": "晴れ ☀", "emoji": "🌧🌧", "e": "\u00e9"})");
  // Arguments before the name, compact, with no whitespace around the object; then empty
  // arguments, and whitespace inside them.
  scripts[3]
      .call("g", R"({"x":[1,{"y":"}"}],"z":{}})", /*arguments_first=*/true, "")
      .call("h", "{}")
      .call("k", "{ \"a\" :\n [ 1 , 2 ] }", false, " \n ");
  // Three calls in one turn, no text.
  scripts[4]
      .call("a", R"({"n": 1})")
      .content("\n")
      .call("b", R"({"n": 2})")
      .content("\n")
      .call("c", R"({"n": [3]})");
  return scripts;
}

// The property a stream of calls is for: after each byte, a call's name and arguments have gone
// out exactly as far as they can be known to belong to the call, never later.
TEST(ToolCallParser, ArgumentFragmentsGoOutAsSoonAsTheyAreKnownToBelong) {
  for (const Script& script : realistic_scripts()) {
    const std::string& text = script.text;
    ToolCallParser bytewise;
    Streamed by_byte;
    for (size_t read = 0; read <= text.size(); ++read) {
      if (read > 0) append(by_byte, bytewise.push(std::string_view(text).substr(read - 1, 1)));
      ToolCallParser replay;
      Streamed at_once;
      append(at_once, replay.push(std::string_view(text).substr(0, read)));
      ASSERT_EQ(at_once.announced, by_byte.announced) << text << " read " << read;
      size_t announced = 0;
      for (size_t i = 0; i < script.calls.size(); ++i) {
        const std::optional<std::string> due = arguments_due(script, script.calls[i], read);
        if (!due) break;
        ASSERT_LT(i, at_once.announced.size()) << text << " read " << read;
        EXPECT_EQ(at_once.announced[i].name, script.calls[i].name) << text << " read " << read;
        ASSERT_EQ(at_once.announced[i].arguments, *due) << text << " read " << read;
        announced = i + 1;
      }
      ASSERT_EQ(at_once.announced.size(), announced) << text << " read " << read;
    }
    append(by_byte, bytewise.finish());
    std::vector<ParsedToolCall> expected;
    for (const ScriptedCall& call : script.calls) expected.push_back({call.name, call.arguments});
    EXPECT_EQ(by_byte.calls, expected) << text;
    EXPECT_EQ(by_byte.announced, expected) << text;
    EXPECT_EQ(split_tool_calls(text).calls, expected) << text;
  }
}

TEST(ToolCallParser, TheFirstFragmentOfACallCarriesItsIndexAndName) {
  ToolCallParser parser;
  EXPECT_TRUE(parser.push("Sure.\n<tool_call>\n{\"name\": \"get_we").fragments.empty());
  ToolCallDelta named = parser.push("ather\", \"argum");
  EXPECT_EQ(named.fragments, (std::vector<ToolCallFragment>{{0, "get_weather", ""}}));
  EXPECT_EQ(parser.push("ents\": {\"city\": \"Pa").fragments,
            (std::vector<ToolCallFragment>{{0, std::nullopt, "{\"city\": \"Pa"}}));
  // The outer '}' and the whitespace after the arguments are not theirs.
  EXPECT_EQ(parser.push("ris\"}}\n").fragments,
            (std::vector<ToolCallFragment>{{0, std::nullopt, "ris\"}"}}));
  ToolCallDelta end = parser.push("</tool_call>\n<tool_call>{\"name\": \"g\", \"arguments\": {}}");
  EXPECT_TRUE(end.content.empty());
  EXPECT_EQ(end.calls, (std::vector<ParsedToolCall>{{"get_weather", R"({"city": "Paris"})"}}));
  EXPECT_EQ(end.fragments, (std::vector<ToolCallFragment>{{1, "g", "{}"}}));
  EXPECT_EQ(parser.push("</tool_call>").calls, (std::vector<ParsedToolCall>{{"g", "{}"}}));
  EXPECT_EQ(parser.num_calls(), 2);
}

// Once a block cannot be a call any more, all of it goes out as content at once, as in the
// whole answer, without waiting for its end tag. A call whose name went out stays in the
// stream as it was (nothing can be taken back); the next call takes the next index.
TEST(ToolCallParser, ABlockThatStopsBeingACallBecomesContentAtOnce) {
  ToolCallParser parser;
  const std::string bad = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"city\": ";
  ToolCallDelta so_far = parser.push(bad);
  EXPECT_EQ(so_far.content, "");
  EXPECT_EQ(so_far.fragments, (std::vector<ToolCallFragment>{{0, "f", "{\"city\": "}}));
  ToolCallDelta broken = parser.push("}, \"x");
  EXPECT_EQ(broken.content, bad + "}, \"x");
  EXPECT_TRUE(broken.fragments.empty());
  EXPECT_EQ(parser.push("\"}\n</tool_call>\n").content, "\"}\n</tool_call>\n");
  ToolCallDelta next = parser.push(call_block("g", "{}"));
  EXPECT_EQ(next.fragments, (std::vector<ToolCallFragment>{{1, "g", "{}"}}));
  EXPECT_EQ(next.calls, (std::vector<ParsedToolCall>{{"g", "{}"}}));
  EXPECT_EQ(parser.num_calls(), 1);

  // Rejected before the name went out: nothing but content.
  for (const std::string& block : {std::string("<tool_call>[{\"name\": \"f\"}]"),
                                   std::string("<tool_call>{\"name\": 7, \"arguments\": {}}"),
                                   std::string("<tool_call>{\"arguments\": {}, \"name\": \"\"}"),
                                   std::string("<tool_call>{\"id\": 1}")}) {
    ToolCallParser fresh;
    const ToolCallDelta delta = fresh.push(block);
    EXPECT_EQ(delta.content, block);
    EXPECT_TRUE(delta.fragments.empty()) << block;
  }
}

TEST(ToolCallParser, AnnouncedCallsThatEndBadlyAreContentInTheEnd) {
  // Cut short by the end of the output.
  ToolCallParser unterminated;
  const std::string start = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}";
  EXPECT_EQ(unterminated.push(start).fragments,
            (std::vector<ToolCallFragment>{{0, "f", "{\"a\": 1}"}}));
  EXPECT_EQ(unterminated.finish().content, start);
  EXPECT_EQ(unterminated.num_calls(), 0);
  // Checked only by the final parse: a lone surrogate in a string.
  ToolCallParser surrogate;
  const std::string block = call_block("f", R"({"s": "\ud800"})");
  const ToolCallDelta delta = surrogate.push(block);
  EXPECT_EQ(delta.fragments, (std::vector<ToolCallFragment>{{0, "f", R"({"s": "\ud800"})"}}));
  EXPECT_EQ(delta.content, block);
  EXPECT_TRUE(delta.calls.empty());
  // Ended by an end tag inside a string: the block is cut there, the rest is text.
  ToolCallParser cut;
  const ToolCallDelta cut_delta =
      cut.push(R"(<tool_call>{"name": "f", "arguments": {"s": "</tool_call>"}}</tool_call>)");
  EXPECT_EQ(cut_delta.fragments, (std::vector<ToolCallFragment>{{0, "f", R"({"s": ")"}}));
  EXPECT_EQ(cut_delta.content,
            R"(<tool_call>{"name": "f", "arguments": {"s": "</tool_call>"}}</tool_call>)");
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
    ASSERT_TRUE(completed_calls_were_announced(whole.calls, streamed.announced)) << text;
    ASSERT_EQ(whole.calls, reference_split_calls(text)) << text;
    // Content and calls account for the whole text but for tags and dropped whitespace.
    size_t accounted = whole.content.size();
    for (const ParsedToolCall& call : whole.calls) accounted += call.arguments.size();
    ASSERT_LE(accounted, text.size()) << text;
  }
}

}  // namespace
}  // namespace pdserve
