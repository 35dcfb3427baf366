// Summary statistics of latency samples, computed the way numpy.percentile does by default
// (linear interpolation between closest ranks), so the figures compare with vLLM's
// benchmark_serving.
#pragma once

#include <span>

namespace pdserve::bench {

struct LatencySummary {
  size_t count = 0;
  double mean = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
  double max = 0;
};

// `percent` in [0, 100]; `samples` need not be sorted. An empty span gives 0.
double percentile(std::span<const double> samples, double percent);

// numpy.mean and numpy.std (population, ddof 0); 0 for an empty span, as vLLM reports it.
double mean(std::span<const double> samples);
double standard_deviation(std::span<const double> samples);

// All fields 0 (count included) for an empty span.
LatencySummary summarize(std::span<const double> samples);

}  // namespace pdserve::bench
