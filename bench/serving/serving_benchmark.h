// Runs a workload against a serving endpoint (closed loop with --max-concurrency, open loop
// with Poisson arrivals, or both) and summarizes it the way vLLM's benchmark_serving does.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/serving/latency_stats.h"
#include "bench/serving/stream_client.h"
#include "bench/serving/workload.h"

namespace pdserve::bench {

// Service-level objectives for goodput (DistServe, vLLM's --goodput): a completed request is
// good when its TTFT, TPOT (0 for a one-token output) and end-to-end latency are within every
// objective that is set.
struct Slo {
  std::optional<double> ttft_ms = std::nullopt;
  std::optional<double> tpot_ms = std::nullopt;
  std::optional<double> e2el_ms = std::nullopt;
  bool any() const { return ttft_ms || tpot_ms || e2el_ms; }
};

// vLLM's --goodput items, "KEY:MS" with KEY ttft, tpot or e2el and MS >= 0; an item may hold
// several separated by spaces ("ttft:500 tpot:50"). Anything else is INVALID_ARGUMENT.
Result<Slo> parse_goodput(const std::vector<std::string>& items);

// The latencies vLLM reports mean, median, std and percentiles of (--percentile-metrics).
inline constexpr const char* kLatencyMetricNames[] = {"ttft", "tpot", "itl", "e2el"};

// vLLM's --percentile-metrics: comma-separated names of kLatencyMetricNames.
Result<std::vector<std::string>> parse_percentile_metrics(const std::string& csv);

// vLLM's --metric-percentiles: comma-separated numbers in [0, 100].
Result<std::vector<double>> parse_metric_percentiles(const std::string& csv);

// How vLLM names percentile `percent` in its keys (p{name}_ttft_ms): Python's str() of the
// number, without ".0" when it is whole: 99 -> "99", 99.9 -> "99.9".
std::string percentile_key_name(double percent);

struct RunOptions {
  std::string label;  // free-form name of the setup (e.g. the topology) for reports and plots
  Endpoint endpoint;
  std::string model;        // empty: the first model of GET /v1/models
  std::string api_key;      // Authorization: Bearer (vLLM's bench reads $OPENAI_API_KEY)
  int max_concurrency = 0;  // 0: no limit
  std::chrono::steady_clock::duration request_timeout = std::chrono::minutes(10);  // per send
  // > 0: a request answered 429 is sent again, honoring Retry-After, while the next send would
  // start within this long of its first (send_retrying_429); 0: a 429 fails the request.
  std::chrono::steady_clock::duration retry_429_for{};
  Slo slo;
  ApiRoute route = ApiRoute::kCompletions;
  std::string backend = "openai";  // vLLM's --backend, written to the JSON
  // The keys mean_/median_/std_/pN_{metric}_ms of the JSON, vLLM's defaults.
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl"};
  std::vector<double> metric_percentiles = {99};
};

struct BenchmarkResult {
  std::string model;
  double duration_s = 0;                 // from the start of the run to the last request finished
  std::vector<RequestOutcome> outcomes;  // in workload order
  int completed = 0;
  int failed = 0;
  int retries_429 = 0;                // 429 answers sent again, over all requests
  long total_input_tokens = 0;        // over completed requests
  long total_output_tokens = 0;       // over completed requests
  double request_throughput = 0;      // completed requests/s
  double input_throughput = 0;        // tokens/s
  double output_throughput = 0;       // tokens/s
  double total_token_throughput = 0;  // input and output tokens/s
  int good = 0;                       // completed within the SLOs (all completed when none set)
  double goodput = 0;                 // good requests/s
  // Milliseconds, over completed requests (TPOT over those with at least two tokens).
  LatencySummary ttft_ms, tpot_ms, itl_ms, e2e_ms;
};

// Fails only when the run cannot start (a chat route with token-id prompts, no model name to be
// had), before any request; request failures are counted in the result.
Result<BenchmarkResult> run_benchmark(const RunOptions& options,
                                      const std::vector<BenchRequest>& requests);

// Fills the counts, throughputs, goodput and latency summaries from result.outcomes.
void summarize_outcomes(BenchmarkResult& result, const Slo& slo);

// The summary table printed on stdout (goodput when an SLO is set), with each distinct error.
std::string format_report(const BenchmarkResult& result, const Slo& slo = {});

// Label, configuration, summary and per-request figures, with each request's server timeline
// when it sent one (for scripts/plot_bench.py), and the same run under the keys of vLLM's result
// JSON (fields in bench/serving/README.md).
nlohmann::ordered_json result_json(const BenchmarkResult& result, const WorkloadOptions& workload,
                                   const RunOptions& options);

}  // namespace pdserve::bench
