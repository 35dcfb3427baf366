#include "proxy/tracing/chrome_trace.h"

#include <algorithm>

namespace pdserve::proxy {
namespace {

using Json = nlohmann::json;

constexpr double kUsPerMs = 1000.0;

struct Span {
  std::string name;
  double start_ms;
  double end_ms;
  Json args;
};

Json complete_event(const Span& span, int pid, int tid, double arrival_us) {
  return {{"name", span.name},
          {"cat", "pdserve"},
          {"ph", "X"},
          {"ts", arrival_us + span.start_ms * kUsPerMs},
          {"dur", std::max(0.0, span.end_ms - span.start_ms) * kUsPerMs},
          {"pid", pid},
          {"tid", tid},
          {"args", span.args}};
}

Json metadata(const char* name, int pid, std::optional<int> tid, Json args) {
  Json event = {{"name", name}, {"ph", "M"}, {"pid", pid}, {"args", std::move(args)}};
  if (tid) event["tid"] = *tid;
  return event;
}

// Spans of one node split into lanes in which they nest: sorted by start (longest first), each
// goes to the first lane whose open spans contain it. A child that overruns its parent by less
// than kSlackMs (rounding in the clock shift) is clipped to it.
std::vector<std::vector<Span>> nest_into_lanes(std::vector<Span> spans) {
  constexpr double kSlackMs = 1e-3;
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.start_ms != b.start_ms ? a.start_ms < b.start_ms : a.end_ms > b.end_ms;
  });
  std::vector<std::vector<Span>> lanes;
  std::vector<std::vector<double>> open_ends;  // per lane, a stack of enclosing ends
  for (Span& span : spans) {
    size_t lane = 0;
    for (; lane < lanes.size(); ++lane) {
      std::vector<double>& stack = open_ends[lane];
      while (!stack.empty() && stack.back() <= span.start_ms) stack.pop_back();
      if (stack.empty() || span.end_ms <= stack.back() + kSlackMs) break;
    }
    if (lane == lanes.size()) {
      lanes.emplace_back();
      open_ends.emplace_back();
    }
    if (!open_ends[lane].empty()) span.end_ms = std::min(span.end_ms, open_ends[lane].back());
    open_ends[lane].push_back(span.end_ms);
    lanes[lane].push_back(std::move(span));
  }
  return lanes;
}

}  // namespace

int ChromeTraceBuilder::pid_for(const std::string& process, Json& events) {
  if (const auto it = pids_.find(process); it != pids_.end()) return it->second;
  const int pid = static_cast<int>(pids_.size()) + 1;
  pids_.emplace(process, pid);
  events.push_back(metadata("process_name", pid, std::nullopt, {{"name", process}}));
  events.push_back(metadata("process_sort_index", pid, std::nullopt, {{"sort_index", pid}}));
  return pid;
}

int ChromeTraceBuilder::new_thread(int pid, const std::string& name, Json& events) {
  const int tid = next_tid_++;
  events.push_back(metadata("thread_name", pid, tid, {{"name", name}}));
  events.push_back(metadata("thread_sort_index", pid, tid, {{"sort_index", tid}}));
  return tid;
}

void ChromeTraceBuilder::add(const RecordedTimeline& request, Json& events) {
  const RequestTimeline& timeline = request.timeline;
  const Json ids = {{"request_id", timeline.request_id}, {"trace_id", timeline.trace_id}};

  // The client's view: E2E with TTFT nested.
  const int requests_pid = pid_for("requests", events);
  const int request_tid = new_thread(requests_pid, timeline.request_id, events);
  const double e2e = std::max(0.0, timeline.e2e_ms);
  Json e2e_args = ids;
  e2e_args["output_tokens"] = timeline.output_tokens;
  e2e_args["tpot_ms"] = timeline.tpot_ms ? Json(*timeline.tpot_ms) : Json(nullptr);
  events.push_back(
      complete_event({"E2E", 0.0, e2e, e2e_args}, requests_pid, request_tid, request.arrival_us));
  if (timeline.ttft_ms) {
    const double ttft_ms = std::clamp(*timeline.ttft_ms, 0.0, e2e);
    events.push_back(
        complete_event({"TTFT", 0.0, ttft_ms, ids}, requests_pid, request_tid, request.arrival_us));
  }

  // Each node's spans, in the order the nodes first appear.
  std::vector<std::string> nodes;
  std::map<std::string, std::vector<Span>> by_node;
  for (const RequestTimelineSpan& span : timeline.spans) {
    if (!by_node.contains(span.node)) nodes.push_back(span.node);
    Json args = timeline_args_json(span.args);
    args.update(ids);
    by_node[span.node].push_back({span.name, span.start_ms, span.end_ms, std::move(args)});
  }
  for (const std::string& node : nodes) {
    const int pid = pid_for(node, events);
    const std::vector<std::vector<Span>> lanes = nest_into_lanes(std::move(by_node[node]));
    for (size_t lane = 0; lane < lanes.size(); ++lane) {
      const std::string thread =
          lane == 0 ? timeline.request_id
                    : timeline.request_id + " (overlap " + std::to_string(lane) + ")";
      const int tid = new_thread(pid, thread, events);
      for (const Span& span : lanes[lane]) {
        events.push_back(complete_event(span, pid, tid, request.arrival_us));
      }
    }
  }
}

Json chrome_trace_document(const std::vector<RecordedTimeline>& requests) {
  ChromeTraceBuilder builder;
  Json events = Json::array();
  for (const RecordedTimeline& request : requests) builder.add(request, events);
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
}

}  // namespace pdserve::proxy
