// W3C Trace Context (https://www.w3.org/TR/trace-context/, version 00) for every hop of a
// request: keep a caller's valid `traceparent` trace id or start a new trace, and name this
// process's own span in the header it forwards (proxy -> decode node -> prefill node).
#pragma once

#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>

namespace pdserve::http {

struct TraceParent {
  std::string trace_id;   // 32 lowercase hex digits, not all zero
  std::string parent_id;  // 16 lowercase hex digits, not all zero
  std::string flags;      // 2 lowercase hex digits
};

// The fields of a version-00 header "00-<trace id>-<parent id>-<flags>"; nullopt for anything
// else (wrong length or version, upper-case or non-hex digits, an all-zero id).
std::optional<TraceParent> parse_traceparent(std::string_view header);

// The ids of one request as the proxy forwards it.
struct TraceContext {
  std::string trace_id;
  std::string span_id;  // this process's span: the parent of the next hop's

  // "00-<trace id>-<span id>-01".
  std::string traceparent() const;
};

// Random trace and span ids. Thread-safe.
class TraceIdGenerator {
 public:
  TraceIdGenerator();

  // The caller's trace id when `header` is a valid traceparent, else a new one; a new span id
  // either way.
  TraceContext context_for(std::optional<std::string_view> header);

 private:
  // `digits` lowercase hex digits, not all zero.
  std::string random_hex(size_t digits);

  std::mutex mutex_;
  std::mt19937_64 random_;
};

}  // namespace pdserve::http
