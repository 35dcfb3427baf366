// Aligned timelines as Chrome trace events (the Trace Event Format that Perfetto and
// chrome://tracing open): one process per node ("proxy", "decode http://...",
// "prefill http://..."), one thread per request in it named by the request id, "X" complete
// events with ts/dur in microseconds on the proxy's steady clock, and a "requests" process
// whose thread per request shows E2E with TTFT nested inside. Spans of one request on one node
// that overlap without nesting (e.g. kv.transfer overlapping prefill.chunk) go to an extra
// thread "<id> (overlap N)" so that every thread's events nest.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/protocol/request_timeline.h"

namespace pdserve::proxy {

// One finished request as the proxy keeps it.
struct RecordedTimeline {
  RequestTimeline timeline;  // aligned (origin "proxy"), see align_timeline()
  double arrival_us = 0.0;   // the proxy's arrival on its steady clock
};

// Turns timelines into events, giving pids and tids that stay unique across calls (so a file
// appended to request by request stays consistent).
class ChromeTraceBuilder {
 public:
  // Appends the request's events, and metadata for the processes and threads it introduces.
  void add(const RecordedTimeline& request, nlohmann::json& events);

 private:
  int pid_for(const std::string& process, nlohmann::json& events);
  int new_thread(int pid, const std::string& name, nlohmann::json& events);

  std::map<std::string, int> pids_;
  int next_tid_ = 1;
};

// {"traceEvents": [...], "displayTimeUnit": "ms"} for these requests, oldest first.
nlohmann::json chrome_trace_document(const std::vector<RecordedTimeline>& requests);

}  // namespace pdserve::proxy
