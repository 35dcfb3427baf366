// Failures come back as a Status naming the template position; hostile templates and contexts
// are bounded (depth, steps, sizes) instead of crashing or hanging.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/chat/chat_template.h"

namespace pdserve {
namespace {

using nlohmann::ordered_json;

std::string repeat(const std::string& text, size_t count) {
  std::string out;
  for (size_t i = 0; i < count; ++i) out += text;
  return out;
}

Result<std::string> render(const std::string& source,
                           const ordered_json& context = ordered_json::object()) {
  auto tmpl = ChatTemplate::parse(source);
  if (!tmpl.ok()) return tmpl.status();
  return tmpl->render(context);
}

void expect_error(const Result<std::string>& result, StatusCode code, const std::string& fragment) {
  ASSERT_FALSE(result.ok()) << "rendered: " << *result;
  EXPECT_EQ(result.status().code(), code) << result.status().to_string();
  EXPECT_NE(result.status().message().find(fragment), std::string::npos)
      << result.status().to_string();
}

TEST(ChatErrors, SyntaxErrorsNameLineAndColumn) {
  auto tmpl = ChatTemplate::parse("Hello\n{% if x %}\n  {{ y + }}\n{% endif %}");
  ASSERT_FALSE(tmpl.ok());
  EXPECT_EQ(tmpl.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(tmpl.status().message().find("line 3:10"), std::string::npos)
      << tmpl.status().message();

  auto unclosed = ChatTemplate::parse("a\nb {% for m in messages %}{{ m }}");
  ASSERT_FALSE(unclosed.ok());
  EXPECT_NE(unclosed.status().message().find("line 2:3"), std::string::npos)
      << unclosed.status().message();
  EXPECT_NE(unclosed.status().message().find("endfor"), std::string::npos);

  for (const char* bad :
       {"{{ 'unterminated }}", "{# no end", "{% frobnicate %}", "{{ x | }}", "{% endif %}",
        "{{ 'a\\q' }}", "{% set 1 = 2 %}", "{{ f(a=1, 2) }}", "{% macro m(a=1, b) %}{% endmacro %}",
        "{{ 99999999999999999999 }}", "{% call m() %}{% endcall %}", "{{ x[] }}", "{{ ☃ }}"}) {
    auto result = ChatTemplate::parse(bad);
    EXPECT_FALSE(result.ok()) << bad;
    if (!result.ok()) {
      EXPECT_NE(result.status().message().find("line 1:"), std::string::npos)
          << result.status().message();
    }
  }
}

TEST(ChatErrors, RuntimeErrorsNamePosition) {
  expect_error(render("ok\n  {{ 'a' + none }}"), StatusCode::kInvalidArgument, "line 2:10");
  expect_error(render("{{ messages[0].content.upper() }}",
                      {{"messages", ordered_json::array({{{"role", "user"}}})}}),
               StatusCode::kInvalidArgument, "cannot call undefined");
}

TEST(ChatErrors, UndefinedValuesBehaveLikeJinjaUndefined) {
  auto result = render(
      "[{{ x }}][{{ x.y.z }}][{{ x is defined }}][{{ x is undefined }}][{{ 'a' if x else 'b' }}]"
      "[{{ x|default('d') }}][{{ 1 in x }}][{{ x == none }}]");
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(*result, "[][][false][true][b][d][false][true]");
  expect_error(render("{{ x + 1 }}"), StatusCode::kInvalidArgument, "undefined");
  expect_error(render("{{ x ~ 'a' }}"), StatusCode::kInvalidArgument, "undefined");
}

TEST(ChatErrors, RaiseExceptionCarriesTheMessage) {
  const char* source =
      "{% if messages|length == 0 %}{{ raise_exception('Conversation is empty!') }}{% endif %}";
  expect_error(render(source, {{"messages", ordered_json::array()}}), StatusCode::kInvalidArgument,
               "template raised an exception: Conversation is empty!");
}

TEST(ChatErrors, RecursionIsBounded) {
  expect_error(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
               StatusCode::kResourceExhausted, "nested deeper");
  // Deep syntax is refused by the parser instead of overflowing the stack.
  expect_error(render("{{ " + repeat("(", 100000) + "1" + repeat(")", 100000) + " }}"),
               StatusCode::kInvalidArgument, "nested too deeply");
  expect_error(render("{{ 1" + repeat(" + 1", 100000) + " }}"), StatusCode::kInvalidArgument,
               "nested too deeply");
  expect_error(render("{{ " + repeat("not ", 100000) + "x }}"), StatusCode::kInvalidArgument,
               "nested too deeply");
  expect_error(render(repeat("{% if x %}", 100000)), StatusCode::kInvalidArgument,
               "nested too deeply");
  expect_error(render("{{ x" + repeat(".a", 100000) + " }}"), StatusCode::kInvalidArgument,
               "nested too deeply");
  // ...and a deeply nested context is refused instead of recursing without bound.
  std::string deep = repeat("[", 100000) + repeat("]", 100000);
  expect_error(render("{{ x }}", {{"x", ordered_json::parse(deep)}}),
               StatusCode::kResourceExhausted, "nested deeper");
}

TEST(ChatErrors, HugeLoopsAndOutputsAreBounded) {
  auto start = std::chrono::steady_clock::now();
  expect_error(render("{% for i in range(1000000000) %}{% endfor %}"),
               StatusCode::kResourceExhausted, "list of");
  expect_error(
      render("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}"),
      StatusCode::kResourceExhausted, "evaluation steps");
  expect_error(
      render("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}"
             "{% endfor %}"),
      StatusCode::kResourceExhausted, "exceeds the limit");
  expect_error(
      render("{% set ns = namespace(l=[1]) %}{% for i in range(100) %}{% set ns.l = ns.l + ns.l %}"
             "{% endfor %}"),
      StatusCode::kResourceExhausted, "list of");
  expect_error(render("{% for i in range(1000000) %}{{ big }}{% endfor %}",
                      {{"big", std::string(1 << 20, 'x')}}),
               StatusCode::kResourceExhausted, "bytes");
  expect_error(render("{% set ns = namespace(v=1) %}{% for i in range(1000) %}{% set ns.v = [ns.v] "
                      "%}{% endfor %}"),
               StatusCode::kResourceExhausted, "nested deeper");
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 120.0);  // generous: sanitizer builds on a loaded machine take ~35 s
}

TEST(ChatErrors, NamespaceCyclesFailToPrintAndDoNotLeak) {
  expect_error(render("{% set ns = namespace() %}{% set ns.self = ns %}{{ ns }}"),
               StatusCode::kResourceExhausted, "too deeply");
  auto result = render("{% set ns = namespace(a=1) %}{% set ns.self = ns %}{{ ns.self.self.a }}");
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(*result, "1");
}

TEST(ChatErrors, ControlFlowOutsideLoopsIsAnError) {
  expect_error(render("{% break %}"), StatusCode::kInvalidArgument, "outside of a for loop");
  expect_error(
      render("{% macro m() %}{% continue %}{% endmacro %}{% for i in [1] %}{{ m() }}{% endfor %}"),
      StatusCode::kInvalidArgument, "outside of a for loop");
}

TEST(ChatErrors, ContextMustBeAnObjectWithoutBuiltinNames) {
  auto tmpl = ChatTemplate::parse("{{ x }}");
  ASSERT_TRUE(tmpl.ok());
  EXPECT_EQ(tmpl->render(ordered_json::array()).status().code(), StatusCode::kInvalidArgument);
  expect_error(render("{{ 1 }}", {{"range", 3}}), StatusCode::kInvalidArgument, "collides");
}

TEST(ChatRender, ContextKeyOrderFollowsJavaScriptObjects) {
  // Insertion order is kept, except that integer-like keys come first in ascending order
  // (Object.entries), as the reference sees a JSON.parse'd context.
  ordered_json context = ordered_json::parse(R"({"d": {"b": 1, "2": 2, "a": 3, "1": 4, "01": 5}})");
  auto result = render("{{ d|tojson }}", context);
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  EXPECT_EQ(*result, R"({"1": 4, "2": 2, "b": 1, "a": 3, "01": 5})");
  // A plain nlohmann::json context stores keys sorted, and renders in that order.
  auto tmpl = ChatTemplate::parse("{{ d|tojson }}");
  ASSERT_TRUE(tmpl.ok());
  auto sorted = tmpl->render(nlohmann::json::parse(R"({"d": {"b": 1, "a": 2}})"));
  ASSERT_TRUE(sorted.ok());
  EXPECT_EQ(*sorted, R"({"a": 2, "b": 1})");
}

TEST(ChatRender, ConcurrentRendersAgree) {
  auto tmpl = ChatTemplate::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ "
      "m.content|upper }}"
      "{% endfor %}{{ ns.n }}");
  ASSERT_TRUE(tmpl.ok());
  ordered_json context = {{"messages", ordered_json::array()}};
  for (int i = 0; i < 50; ++i)
    context["messages"].push_back({{"role", "user"}, {"content", "m" + std::to_string(i)}});
  auto expected = tmpl->render(context);
  ASSERT_TRUE(expected.ok());
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        auto result = tmpl->render(context);
        if (!result.ok() || *result != *expected) ++mismatches[static_cast<size_t>(t)];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int count : mismatches) EXPECT_EQ(count, 0);
}

TEST(ChatRender, ExtensionsBeyondTheReference) {
  // The reference rejects these; they follow Python Jinja here.
  auto result = render(
      "{{ 2.5|round }} {{ 2.675|round(2) }} {{ 3.14159|round(2, 'floor') }} {{ 2|round }} "
      "{{ x|default }}|{{ 3 is equalto(3) }}{{ 'a' is eq('b') }}");
  ASSERT_TRUE(result.ok()) << result.status().to_string();
  // round() is Python's: ties to even on the exact binary value (2.675 is 2.67499999...).
  EXPECT_EQ(*result, "2.0 2.67 3.14 2.0 |truefalse");
}

}  // namespace
}  // namespace pdserve
