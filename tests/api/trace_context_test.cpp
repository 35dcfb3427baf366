// traceparent handling against the W3C Trace Context rules (version 00).
#include "decode_node/trace_context.h"

#include <gtest/gtest.h>

namespace pdserve {
namespace {

constexpr const char* kValid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

bool is_hex_id(const std::string& text, size_t digits) {
  return text.size() == digits && text.find_first_not_of("0123456789abcdef") == std::string::npos &&
         text.find_first_not_of('0') != std::string::npos;
}

TEST(TraceContextTest, ParsesTheSpecExample) {
  const std::optional<TraceContext> parsed = parse_traceparent(kValid);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(parsed->span_id, "00f067aa0ba902b7");
}

TEST(TraceContextTest, RefusesInvalidHeaders) {
  for (const char* header : {
           "",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",      // no flags
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",  // trailing
           "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // unknown version
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",   // zero trace id
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",   // zero parent id
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",   // uppercase
           "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",   // not hex
           "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",   // separators
       }) {
    EXPECT_FALSE(parse_traceparent(header).has_value()) << header;
  }
}

TEST(TraceContextTest, ContinuesAValidTraceWithANewSpan) {
  const TraceContext context = continue_or_start_trace(std::string_view(kValid));
  EXPECT_EQ(context.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_TRUE(is_hex_id(context.span_id, 16));
  EXPECT_NE(context.span_id, "00f067aa0ba902b7");
  const std::string child = traceparent_header(context);
  const std::optional<TraceContext> reparsed = parse_traceparent(child);
  ASSERT_TRUE(reparsed.has_value()) << child;
  EXPECT_EQ(reparsed->trace_id, context.trace_id);
  EXPECT_EQ(reparsed->span_id, context.span_id);
  EXPECT_EQ(child.substr(53), "01");
}

TEST(TraceContextTest, StartsFreshTracesWhenAbsentOrInvalid) {
  const TraceContext absent = continue_or_start_trace(std::nullopt);
  const TraceContext invalid = continue_or_start_trace(std::string_view("garbage"));
  EXPECT_TRUE(is_hex_id(absent.trace_id, 32));
  EXPECT_TRUE(is_hex_id(invalid.trace_id, 32));
  EXPECT_TRUE(is_hex_id(absent.span_id, 16));
  EXPECT_NE(absent.trace_id, invalid.trace_id) << "128 random bits collided";
}

}  // namespace
}  // namespace pdserve
