// traceparent handling against the W3C Trace Context rules (version 00), as every hop of a
// request uses it (proxy -> decode node -> prefill node).
#include "common/http/traceparent.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace pdserve::http {
namespace {

constexpr const char* kSpecExample = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

bool is_hex_id(const std::string& text, size_t digits) {
  return text.size() == digits && text.find_first_not_of("0123456789abcdef") == std::string::npos &&
         text.find_first_not_of('0') != std::string::npos;
}

TEST(TraceParentTest, ParsesTheSpecExample) {
  const std::optional<TraceParent> parsed = parse_traceparent(kSpecExample);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(parsed->parent_id, "00f067aa0ba902b7");
  EXPECT_EQ(parsed->flags, "01");
}

TEST(TraceParentTest, RefusesInvalidHeaders) {
  for (const char* header : {
           "",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",      // no flags
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",  // trailing dash
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ",  // trailing space
           "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // unknown version
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",   // zero trace id
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",   // zero parent id
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",   // upper case
           "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",   // not hex
           "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",   // separators
       }) {
    EXPECT_FALSE(parse_traceparent(header).has_value()) << header;
  }
}

TEST(TraceParentTest, ContinuesAValidTraceWithANewSpan) {
  TraceIdGenerator ids;
  const TraceContext context = ids.context_for(std::string_view(kSpecExample));
  EXPECT_EQ(context.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_TRUE(is_hex_id(context.span_id, 16));
  EXPECT_NE(context.span_id, "00f067aa0ba902b7");
  const std::string child = context.traceparent();
  const std::optional<TraceParent> reparsed = parse_traceparent(child);
  ASSERT_TRUE(reparsed.has_value()) << child;
  EXPECT_EQ(reparsed->trace_id, context.trace_id);
  EXPECT_EQ(reparsed->parent_id, context.span_id);
  EXPECT_EQ(reparsed->flags, "01");
}

TEST(TraceParentTest, StartsFreshTracesWhenAbsentOrInvalid) {
  TraceIdGenerator ids;
  std::set<std::string> traces;
  for (int i = 0; i < 100; ++i) {
    const TraceContext fresh =
        ids.context_for(i % 2 ? std::optional<std::string_view>("garbage") : std::nullopt);
    EXPECT_TRUE(is_hex_id(fresh.trace_id, 32)) << fresh.trace_id;
    EXPECT_TRUE(is_hex_id(fresh.span_id, 16)) << fresh.span_id;
    ASSERT_TRUE(parse_traceparent(fresh.traceparent()).has_value()) << fresh.traceparent();
    traces.insert(fresh.trace_id);
  }
  EXPECT_EQ(traces.size(), 100u) << "128 random bits collided";
}

}  // namespace
}  // namespace pdserve::http
