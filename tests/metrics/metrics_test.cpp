#include "common/metrics/metrics.h"

#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace pdserve::metrics {
namespace {

TEST(MetricsTest, RendersTheTextFormat) {
  Registry registry;
  registry.counter("pdserve:http_requests_total", "HTTP requests.", {{"status", "200"}}).inc(3);
  registry.counter("pdserve:http_requests_total", "HTTP requests.", {{"status", "404"}}).inc();
  registry.gauge("pdserve:num_requests_running", "Running.").set(2.5);
  Histogram& latency = registry.histogram("pdserve:e2e_request_latency_seconds", "Latency.",
                                          {0.1, 1.0}, {{"model_name", "m\"x"}});
  latency.observe(0.05);
  latency.observe(0.1);  // on a bound: counted in that bucket (le)
  latency.observe(0.5);
  latency.observe(7.0);
  EXPECT_EQ(registry.render(),
            "# HELP pdserve:e2e_request_latency_seconds Latency.\n"
            "# TYPE pdserve:e2e_request_latency_seconds histogram\n"
            "pdserve:e2e_request_latency_seconds_bucket{model_name=\"m\\\"x\",le=\"0."
            "1\"} 2\n"
            "pdserve:e2e_request_latency_seconds_bucket{model_name=\"m\\\"x\",le=\"1\"} 3\n"
            "pdserve:e2e_request_latency_seconds_bucket{model_name=\"m\\\"x\",le=\"+Inf\"} 4\n"
            "pdserve:e2e_request_latency_seconds_sum{model_name=\"m\\\"x\"} 7.65\n"
            "pdserve:e2e_request_latency_seconds_count{model_name=\"m\\\"x\"} 4\n"
            "# HELP pdserve:http_requests_total HTTP requests.\n"
            "# TYPE pdserve:http_requests_total counter\n"
            "pdserve:http_requests_total{status=\"200\"} 3\n"
            "pdserve:http_requests_total{status=\"404\"} 1\n"
            "# HELP pdserve:num_requests_running Running.\n"
            "# TYPE pdserve:num_requests_running gauge\n"
            "pdserve:num_requests_running 2.5\n");
}

TEST(MetricsTest, SameNameAndLabelsIsTheSameSeries) {
  Registry registry;
  Counter& a = registry.counter("c", "h", {{"k", "v"}});
  Counter& b = registry.counter("c", "h", {{"k", "v"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &registry.counter("c", "h", {{"k", "w"}}));
}

TEST(MetricsTest, ConcurrentUpdatesAreNotLost) {
  Registry registry;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&registry, t] {
      for (int i = 0; i < 20000; ++i) {
        registry.counter("c", "h", {{"parity", t % 2 ? "odd" : "even"}}).inc();
        registry.histogram("h", "h", {1.0, 2.0}).observe(i % 3);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(registry.counter("c", "h", {{"parity", "odd"}}).value(), 80000);
  EXPECT_EQ(registry.counter("c", "h", {{"parity", "even"}}).value(), 80000);
  const Histogram::Snapshot snap = registry.histogram("h", "h", {1.0, 2.0}).snapshot();
  EXPECT_EQ(snap.count, 160000u);
  EXPECT_EQ(snap.cumulative_counts.back(), snap.count);
  // i % 3 over 20000 values: 6667 zeros, 6667 ones, 6666 twos per thread.
  EXPECT_EQ(snap.cumulative_counts[0], 8u * (6667 + 6667));
  EXPECT_EQ(snap.sum, 8.0 * (6667 + 2 * 6666));
}

}  // namespace
}  // namespace pdserve::metrics
