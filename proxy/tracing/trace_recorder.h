// Where finished requests' timelines go: the last --trace-capacity of them for
// GET /trace?last=N and GET /trace?request_id=ID (Chrome trace JSON), and --trace-file.
// Thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "common/http/http_message.h"
#include "common/protocol/openai_error.h"
#include "proxy/tracing/trace_file.h"
#include "proxy/tracing/trace_store.h"

namespace pdserve::proxy {

inline constexpr size_t kDefaultTraceLast = 100;

// What GET /trace asks for: the newest `last` requests, or the one with `request_id`.
struct TraceQuery {
  size_t last = kDefaultTraceLast;
  std::string request_id;  // empty: `last`
};

// Parses the query of `target` ("/trace?last=5"); 400 naming the parameter for `last` that is
// not an integer in [1, capacity], an empty request_id, both at once, or another parameter.
ApiResult<TraceQuery> parse_trace_query(std::string_view target, size_t capacity);

class TraceRecorder {
 public:
  explicit TraceRecorder(size_t capacity) : store_(capacity) {}

  // From now on also append each request to `path` (see TraceFile).
  Status write_to_file(const std::string& path);

  // Keeps the request for /trace and appends it to the trace file; a failed write is logged
  // once per failure and does not stop the proxy.
  void record(const RecordedTimeline& request);

  // The answer to GET /trace?...: 200 with the trace document, 400, or 404 for an unknown
  // request id.
  http::HttpResponse handle(const http::HttpRequest& request) const;

 private:
  TraceStore store_;
  std::unique_ptr<TraceFile> file_;
};

}  // namespace pdserve::proxy
