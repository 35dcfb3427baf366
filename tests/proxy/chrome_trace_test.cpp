// GET /trace documents (valid JSON, pids/tids and their metadata, durations >= 0, events on
// each thread nesting, E2E containing TTFT), its 400/404 answers, and a --trace-file that
// still loads when cut at any byte.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "proxy/tracing/chrome_trace.h"
#include "proxy/tracing/trace_file.h"
#include "proxy/tracing/trace_recorder.h"

namespace pdserve::proxy {
namespace {

using Json = nlohmann::json;

// An aligned timeline whose prefill spans overlap without nesting (a layer-by-layer KV
// transfer running beside the last chunk), as the proxy records them.
RecordedTimeline recorded(const std::string& id, double arrival_us) {
  Json spans = {
      {{"name", "proxy.request"},
       {"node", "proxy"},
       {"start_ms", 0.0},
       {"end_ms", 50.0},
       {"args", {{"attempts", 1}}}},
      {{"name", "proxy.route"}, {"node", "proxy"}, {"start_ms", 0.0}, {"end_ms", 0.5}},
      {{"name", "decode.request"},
       {"node", "decode http://127.0.0.1:8200"},
       {"start_ms", 1.0},
       {"end_ms", 49.0}},
      {{"name", "decode.steps"},
       {"node", "decode http://127.0.0.1:8200"},
       {"start_ms", 30.0},
       {"end_ms", 49.0},
       {"args", {{"tokens", 4}}}},
      {{"name", "prefill.request"},
       {"node", "prefill http://127.0.0.1:8100"},
       {"start_ms", 2.0},
       {"end_ms", 28.0}},
      {{"name", "prefill.chunk"},
       {"node", "prefill http://127.0.0.1:8100"},
       {"start_ms", 5.0},
       {"end_ms", 15.0}},
      {{"name", "kv.transfer"},
       {"node", "prefill http://127.0.0.1:8100"},
       {"start_ms", 10.0},
       {"end_ms", 27.0},
       {"args", {{"bytes", 4096}}}},
  };
  const Json timeline = {
      {"version", 1},
      {"request_id", id},
      {"trace_id", "4bf92f3577b34da6a3ce929d0e0e4736"},
      {"origin", "proxy"},
      {"spans", spans},
      {"tokens_ms", {16.0, 35.0, 40.0, 45.0, 49.0}},
      {"output_tokens", 5},
      {"ttft_ms", 17.0},
      {"tpot_ms", 8.25},
      {"e2e_ms", 50.0},
  };
  return {RequestTimeline::parse(timeline).value(), arrival_us};
}

// Checks the structure of a list of trace events; returns process name -> thread names.
std::map<std::string, std::multiset<std::string>> check_events(const Json& events) {
  std::map<int, std::string> processes;
  std::map<std::pair<int, int>, std::string> threads;
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> slices;
  for (const Json& event : events) {
    const std::string ph = event.at("ph");
    const int pid = event.at("pid");
    if (ph == "M") {
      if (event["name"] == "process_name") processes[pid] = event["args"]["name"];
      if (event["name"] == "thread_name") threads[{pid, event["tid"]}] = event["args"]["name"];
      continue;
    }
    EXPECT_EQ(ph, "X");
    const double ts = event.at("ts");
    const double dur = event.at("dur");
    EXPECT_GE(dur, 0.0) << event;
    EXPECT_TRUE(event["args"].contains("trace_id")) << event;
    slices[{pid, event.at("tid")}].emplace_back(ts, ts + dur);
  }
  for (auto& [thread, spans] : slices) {
    EXPECT_TRUE(processes.contains(thread.first)) << "pid " << thread.first;
    EXPECT_TRUE(threads.contains(thread)) << "tid " << thread.second;
    // On one thread, slices either nest or are disjoint.
    std::sort(spans.begin(), spans.end(), [](auto a, auto b) {
      return a.first != b.first ? a.first < b.first : a.second > b.second;
    });
    std::vector<double> open;
    for (const auto& [start, end] : spans) {
      while (!open.empty() && open.back() <= start) open.pop_back();
      if (!open.empty()) {
        EXPECT_LE(end, open.back()) << threads[thread];
      }
      open.push_back(end);
    }
  }
  std::map<std::string, std::multiset<std::string>> named;
  for (const auto& [thread, name] : threads) named[processes[thread.first]].insert(name);
  return named;
}

TEST(ChromeTrace, ProcessesPerNodeThreadsPerRequest) {
  const Json document =
      chrome_trace_document({recorded("cmpl-a", 1.0e9), recorded("cmpl-b", 1.00002e9)});
  ASSERT_TRUE(document["traceEvents"].is_array());
  EXPECT_EQ(document["displayTimeUnit"], "ms");
  const auto named = check_events(document["traceEvents"]);
  EXPECT_EQ(named.size(), 4u);  // requests, proxy, decode, prefill
  EXPECT_EQ(named.at("requests"), (std::multiset<std::string>{"cmpl-a", "cmpl-b"}));
  EXPECT_EQ(named.at("proxy"), (std::multiset<std::string>{"cmpl-a", "cmpl-b"}));
  EXPECT_EQ(named.at("decode http://127.0.0.1:8200"),
            (std::multiset<std::string>{"cmpl-a", "cmpl-b"}));
  // kv.transfer overlaps prefill.chunk and outlives nothing: it gets its own lane.
  EXPECT_EQ(
      named.at("prefill http://127.0.0.1:8100"),
      (std::multiset<std::string>{"cmpl-a", "cmpl-a (overlap 1)", "cmpl-b", "cmpl-b (overlap 1)"}));

  // Microseconds on the proxy's clock; E2E holds TTFT.
  std::map<std::string, Json> of_a;
  for (const Json& event : document["traceEvents"]) {
    if (event["ph"] == "X" && event["args"]["request_id"] == "cmpl-a") of_a[event["name"]] = event;
  }
  EXPECT_DOUBLE_EQ(of_a["decode.request"]["ts"].get<double>(), 1.0e9 + 1000.0);
  EXPECT_DOUBLE_EQ(of_a["decode.request"]["dur"].get<double>(), 48000.0);
  EXPECT_EQ(of_a["kv.transfer"]["args"]["bytes"], 4096);
  EXPECT_DOUBLE_EQ(of_a["E2E"]["dur"].get<double>(), 50000.0);
  EXPECT_DOUBLE_EQ(of_a["TTFT"]["dur"].get<double>(), 17000.0);
  EXPECT_EQ(of_a["TTFT"]["tid"], of_a["E2E"]["tid"]);
}

http::HttpRequest get(const std::string& target) {
  http::HttpRequest request;
  request.method = "GET";
  request.target = target;
  request.path = "/trace";
  return request;
}

TEST(TraceRecorder, LastAndRequestId) {
  TraceRecorder recorder(3);
  for (int i = 0; i < 5; ++i) recorder.record(recorded("cmpl-" + std::to_string(i), i * 1e6));
  const auto threads_of = [&](const std::string& target) {
    const http::HttpResponse response = recorder.handle(get(target));
    EXPECT_EQ(response.status, 200) << target << ": " << response.body;
    const Json document = Json::parse(response.body);
    return check_events(document["traceEvents"])["requests"];
  };
  // The capacity keeps the newest three.
  EXPECT_EQ(threads_of("/trace"), (std::multiset<std::string>{"cmpl-2", "cmpl-3", "cmpl-4"}));
  EXPECT_EQ(threads_of("/trace?last=2"), (std::multiset<std::string>{"cmpl-3", "cmpl-4"}));
  EXPECT_EQ(threads_of("/trace?request_id=cmpl-3"), (std::multiset<std::string>{"cmpl-3"}));
  EXPECT_EQ(threads_of("/trace?request_id=cmpl%2D3"), (std::multiset<std::string>{"cmpl-3"}));
}

TEST(TraceRecorder, BadQueriesAre400AndUnknownIds404) {
  TraceRecorder recorder(10);
  recorder.record(recorded("cmpl-1", 0.0));
  for (const char* target :
       {"/trace?last=0", "/trace?last=-1", "/trace?last=11", "/trace?last=x", "/trace?last=2.5",
        "/trace?last=", "/trace?request_id=", "/trace?last=2&request_id=cmpl-1", "/trace?limit=3",
        "/trace?request_id=%zz"}) {
    const http::HttpResponse response = recorder.handle(get(target));
    EXPECT_EQ(response.status, 400) << target;
    const Json body = Json::parse(response.body);
    EXPECT_EQ(body["error"]["type"], "invalid_request_error") << target;
    EXPECT_TRUE(body["error"]["message"].is_string());
  }
  const http::HttpResponse missing = recorder.handle(get("/trace?request_id=cmpl-404"));
  EXPECT_EQ(missing.status, 404);
  const Json body = Json::parse(missing.body);
  EXPECT_NE(body["error"]["message"].get<std::string>().find("cmpl-404"), std::string::npos);
  EXPECT_EQ(body["error"]["param"], "request_id");
}

// What a JSON Array Format reader does with a file that may be cut: the closing bracket is
// optional, and an event cut in the middle is dropped (it is on the last line).
Json load_cut_trace(std::string text) {
  const size_t last_newline = text.rfind('\n');
  text.resize(last_newline == std::string::npos ? 0 : last_newline + 1);
  if (text.empty()) return Json::array();
  while (!text.empty() && (text.back() == '\n' || text.back() == ',')) text.pop_back();
  return Json::parse(text + "]");
}

TEST(TraceFile, LoadsWhenCutAnywhere) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("pdserve_trace_" + std::to_string(getpid()) + ".json"))
                               .string();
  {
    Result<std::unique_ptr<TraceFile>> file = TraceFile::open(path);
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE((*file)->append(recorded("cmpl-" + std::to_string(i), i * 1e5)).ok());
    }
  }
  std::stringstream content;
  content << std::ifstream(path).rdbuf();
  const std::string text = content.str();
  std::filesystem::remove(path);
  ASSERT_TRUE(text.starts_with("[\n"));

  const Json whole = load_cut_trace(text);
  const auto named = check_events(whole);
  EXPECT_EQ(named.at("requests"), (std::multiset<std::string>{"cmpl-0", "cmpl-1", "cmpl-2"}));
  // pids stay the same across appends: one process per node in the whole file.
  EXPECT_EQ(named.size(), 4u);

  size_t previous = 0;
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    Json events;
    ASSERT_NO_THROW(events = load_cut_trace(text.substr(0, cut))) << "cut at " << cut;
    ASSERT_GE(events.size(), previous) << "cut at " << cut;
    previous = events.size();
    for (size_t i = 0; i < events.size(); ++i) ASSERT_EQ(events[i], whole[i]);
  }
  EXPECT_EQ(previous, whole.size());
}

TEST(TraceFile, UnwritablePathIsAClearError) {
  Result<std::unique_ptr<TraceFile>> file = TraceFile::open("/nonexistent-dir/trace.json");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("/nonexistent-dir/trace.json"), std::string::npos);
}

}  // namespace
}  // namespace pdserve::proxy
