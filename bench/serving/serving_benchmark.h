// Runs a workload against a serving endpoint (closed loop with --max-concurrency, open loop
// with Poisson arrivals, or both) and summarizes it the way vLLM's benchmark_serving does.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/serving/latency_stats.h"
#include "bench/serving/stream_client.h"
#include "bench/serving/workload.h"

namespace pdserve::bench {

// Service-level objectives for goodput (DistServe): a completed request is good when its TTFT
// and its TPOT are within every objective that is set (0: not set).
struct Slo {
  double ttft_ms = 0;
  double tpot_ms = 0;
  bool any() const { return ttft_ms > 0 || tpot_ms > 0; }
};

struct RunOptions {
  std::string label;  // free-form name of the setup (e.g. the topology) for reports and plots
  Endpoint endpoint;
  std::string model;        // empty: the first model of GET /v1/models
  int max_concurrency = 0;  // 0: no limit
  std::chrono::steady_clock::duration request_timeout = std::chrono::minutes(10);
  Slo slo;
};

struct BenchmarkResult {
  std::string model;
  double duration_s = 0;                 // from the start of the run to the last request finished
  std::vector<RequestOutcome> outcomes;  // in workload order
  int completed = 0;
  int failed = 0;
  long total_input_tokens = 0;    // over completed requests
  long total_output_tokens = 0;   // over completed requests
  double request_throughput = 0;  // completed requests/s
  double input_throughput = 0;    // tokens/s
  double output_throughput = 0;   // tokens/s
  int good = 0;                   // completed within the SLOs (all completed when none set)
  double goodput = 0;             // good requests/s
  // Milliseconds, over completed requests (TPOT over those with at least two tokens).
  LatencySummary ttft_ms, tpot_ms, itl_ms, e2e_ms;
};

// Fails only when the run cannot start (no model name to be had); request failures are
// counted in the result.
Result<BenchmarkResult> run_benchmark(const RunOptions& options,
                                      const std::vector<BenchRequest>& requests);

// Fills the counts, throughputs, goodput and latency summaries from result.outcomes.
void summarize_outcomes(BenchmarkResult& result, const Slo& slo);

// The summary table printed on stdout (goodput when an SLO is set), with each distinct error.
std::string format_report(const BenchmarkResult& result, const Slo& slo = {});

// Label, configuration, summary and per-request figures, with each request's server timeline
// when it sent one (for scripts/plot_bench.py; fields in bench/serving/README.md).
nlohmann::ordered_json result_json(const BenchmarkResult& result, const WorkloadOptions& workload,
                                   const RunOptions& options);

}  // namespace pdserve::bench
