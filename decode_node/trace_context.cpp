#include "decode_node/trace_context.h"

#include <random>

namespace pdserve {
namespace {

bool is_lower_hex(std::string_view text) {
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool all_zero(std::string_view text) {
  return text.find_first_not_of('0') == std::string_view::npos;
}

// `digits` random lowercase hex digits, not all zero (the spec's invalid value).
std::string random_hex(size_t digits) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::random_device device;
  std::string out;
  do {
    out.clear();
    while (out.size() < digits) {
      uint32_t bits = device();
      for (int i = 0; i < 8 && out.size() < digits; ++i, bits >>= 4) out.push_back(kHex[bits & 15]);
    }
  } while (all_zero(out));
  return out;
}

}  // namespace

std::optional<TraceContext> parse_traceparent(std::string_view header) {
  // version(2) - trace-id(32) - parent-id(16) - flags(2)
  if (header.size() != 55 || header[2] != '-' || header[35] != '-' || header[52] != '-') {
    return std::nullopt;
  }
  const std::string_view version = header.substr(0, 2);
  const std::string_view trace_id = header.substr(3, 32);
  const std::string_view parent_id = header.substr(36, 16);
  const std::string_view flags = header.substr(53, 2);
  if (version != "00" || !is_lower_hex(trace_id) || !is_lower_hex(parent_id) ||
      !is_lower_hex(flags) || all_zero(trace_id) || all_zero(parent_id)) {
    return std::nullopt;
  }
  return TraceContext{std::string(trace_id), std::string(parent_id)};
}

TraceContext continue_or_start_trace(std::optional<std::string_view> header) {
  std::optional<TraceContext> parent = header ? parse_traceparent(*header) : std::nullopt;
  return {parent ? parent->trace_id : random_hex(32), random_hex(16)};
}

std::string traceparent_header(const TraceContext& context) {
  return "00-" + context.trace_id + "-" + context.span_id + "-01";
}

}  // namespace pdserve
