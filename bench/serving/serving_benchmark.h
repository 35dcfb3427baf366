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

struct RunOptions {
  Endpoint endpoint;
  std::string model;        // empty: the first model of GET /v1/models
  int max_concurrency = 0;  // 0: no limit
  std::chrono::steady_clock::duration request_timeout = std::chrono::minutes(10);
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
  // Milliseconds, over completed requests (TPOT over those with at least two tokens).
  LatencySummary ttft_ms, tpot_ms, itl_ms, e2e_ms;
};

// Fails only when the run cannot start (no model name to be had); request failures are
// counted in the result.
Result<BenchmarkResult> run_benchmark(const RunOptions& options,
                                      const std::vector<BenchRequest>& requests);

// The summary table printed on stdout, with up to a few distinct errors.
std::string format_report(const BenchmarkResult& result);

// Configuration, summary and per-request figures (for plots).
nlohmann::ordered_json result_json(const BenchmarkResult& result, const WorkloadOptions& workload,
                                   const RunOptions& options);

}  // namespace pdserve::bench
