#include "common/http/traceparent.h"

#include <algorithm>

namespace pdserve::http {
namespace {

constexpr size_t kTraceIdDigits = 32;
constexpr size_t kSpanIdDigits = 16;
// "00-" + 32 + "-" + 16 + "-" + 2.
constexpr size_t kHeaderLength = 3 + kTraceIdDigits + 1 + kSpanIdDigits + 1 + 2;

bool is_lower_hex(std::string_view text) {
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool all_zero(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return c == '0'; });
}

}  // namespace

std::optional<TraceParent> parse_traceparent(std::string_view header) {
  if (header.size() != kHeaderLength || !header.starts_with("00-")) return std::nullopt;
  const std::string_view trace_id = header.substr(3, kTraceIdDigits);
  const size_t parent_at = 3 + kTraceIdDigits + 1;
  const std::string_view parent_id = header.substr(parent_at, kSpanIdDigits);
  const size_t flags_at = parent_at + kSpanIdDigits + 1;
  const std::string_view flags = header.substr(flags_at);
  if (header[parent_at - 1] != '-' || header[flags_at - 1] != '-') return std::nullopt;
  if (!is_lower_hex(trace_id) || !is_lower_hex(parent_id) || !is_lower_hex(flags)) {
    return std::nullopt;
  }
  if (all_zero(trace_id) || all_zero(parent_id)) return std::nullopt;
  return TraceParent{std::string(trace_id), std::string(parent_id), std::string(flags)};
}

std::string TraceContext::traceparent() const {
  return "00-" + trace_id + "-" + span_id + "-01";
}

TraceIdGenerator::TraceIdGenerator() : random_(std::random_device{}()) {}

std::string TraceIdGenerator::random_hex(size_t digits) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex(digits, '0');
  while (all_zero(hex)) {
    for (char& c : hex) c = kDigits[random_() & 0xf];
  }
  return hex;
}

TraceContext TraceIdGenerator::context_for(std::optional<std::string_view> header) {
  std::lock_guard lock(mutex_);
  TraceContext context;
  const std::optional<TraceParent> parent = header ? parse_traceparent(*header) : std::nullopt;
  context.trace_id = parent ? parent->trace_id : random_hex(kTraceIdDigits);
  context.span_id = random_hex(kSpanIdDigits);
  return context;
}

}  // namespace pdserve::http
