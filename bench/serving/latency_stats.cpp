#include "bench/serving/latency_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace pdserve::bench {
namespace {

double sorted_percentile(const std::vector<double>& sorted, double percent) {
  if (sorted.empty()) return 0;
  const double rank =
      std::clamp(percent, 0.0, 100.0) / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(rank));
  const size_t above = std::min(below + 1, sorted.size() - 1);
  const double fraction = rank - static_cast<double>(below);
  return sorted[below] + (sorted[above] - sorted[below]) * fraction;
}

}  // namespace

double percentile(std::span<const double> samples, double percent) {
  std::vector<double> sorted(samples.begin(), samples.end());
  std::sort(sorted.begin(), sorted.end());
  return sorted_percentile(sorted, percent);
}

double mean(std::span<const double> samples) {
  if (samples.empty()) return 0;
  return std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(samples.size());
}

double standard_deviation(std::span<const double> samples) {
  if (samples.empty()) return 0;
  const double average = mean(samples);
  double squares = 0;
  for (double sample : samples) squares += (sample - average) * (sample - average);
  return std::sqrt(squares / static_cast<double>(samples.size()));
}

LatencySummary summarize(std::span<const double> samples) {
  LatencySummary summary;
  if (samples.empty()) return summary;
  std::vector<double> sorted(samples.begin(), samples.end());
  std::sort(sorted.begin(), sorted.end());
  summary.count = sorted.size();
  summary.mean = mean(sorted);
  summary.p50 = sorted_percentile(sorted, 50);
  summary.p90 = sorted_percentile(sorted, 90);
  summary.p99 = sorted_percentile(sorted, 99);
  summary.max = sorted.back();
  return summary;
}

}  // namespace pdserve::bench
