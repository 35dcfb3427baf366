// A small Prometheus registry: counters, gauges and fixed-bucket histograms, each a family of
// series told apart by labels, rendered in the text exposition format (version 0.0.4).
// Thread-safe: series are created under a lock and updated lock-free (histograms lock their
// own series); references returned by the registry stay valid for its lifetime.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace pdserve::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void inc(double amount = 1.0) { value_.fetch_add(amount, std::memory_order_relaxed); }
  // Adds what a cumulative figure (e.g. an engine's stats) grew by since `before`; nothing when
  // it did not grow.
  template <typename T>
  void advance(T now, T before) {
    if (now > before) inc(static_cast<double>(now - before));
  }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void set(double value) { value_.store(value, std::memory_order_relaxed); }
  void add(double amount) { value_.fetch_add(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  // Upper bounds, strictly increasing; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);

  void observe(double value);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative_counts;  // one per bound, then +Inf
    double sum = 0.0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), last one is +Inf
  double sum_ = 0.0;
};

class Registry {
 public:
  // The series of `name` with these labels, created on first use. A name registered with
  // another type, or a histogram asked with other buckets, is a programming error (PDS_CHECK).
  Counter& counter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& histogram(const std::string& name, const std::string& help,
                       const std::vector<double>& bounds, const Labels& labels = {});

  // Every family, sorted by name, with # HELP and # TYPE lines.
  std::string render() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family {
    Type type;
    std::string help;
    std::vector<double> bounds;
    // rendered label set -> series
    std::map<std::string, std::unique_ptr<Counter>> counters;
    std::map<std::string, std::unique_ptr<Gauge>> gauges;
    std::map<std::string, std::unique_ptr<Histogram>> histograms;
  };

  Family& family(const std::string& name, const std::string& help, Type type);

  mutable std::mutex mutex_;
  std::map<std::string, Family> families_;
};

// {a="x",b="y"} with Prometheus escaping; "" for no labels.
std::string render_labels(const Labels& labels);

}  // namespace pdserve::metrics
