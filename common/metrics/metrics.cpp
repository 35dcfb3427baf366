#include "common/metrics/metrics.h"

#include <algorithm>
#include <cmath>
#include <charconv>

#include "common/core/status.h"

namespace pdserve::metrics {
namespace {

std::string escape_label_value(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string format_number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char text[64];
  const auto result = std::to_chars(text, text + sizeof(text), value);  // shortest round trip
  return std::string(text, result.ptr);
}

// Adds one label to a rendered label set ("" or "{...}").
std::string with_label(const std::string& rendered, const std::string& name,
                       const std::string& value) {
  const std::string label = name + "=\"" + value + "\"";
  if (rendered.empty()) return "{" + label + "}";
  return rendered.substr(0, rendered.size() - 1) + "," + label + "}";
}

const char* type_name(int type) {
  static constexpr const char* kNames[] = {"counter", "gauge", "histogram"};
  return kNames[type];
}

}  // namespace

std::string render_labels(const Labels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) out += ',';
    out += labels[i].first + "=\"" + escape_label_value(labels[i].second) + "\"";
  }
  return out + "}";
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  PDS_CHECK(std::is_sorted(bounds_.begin(), bounds_.end()) &&
                std::adjacent_find(bounds_.begin(), bounds_.end()) == bounds_.end(),
            "histogram bounds must be strictly increasing");
}

void Histogram::observe(double value) {
  // Prometheus buckets are "less than or equal": the first bound >= value.
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  std::lock_guard lock(mutex_);
  ++counts_[bucket];
  sum_ += value;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot snapshot;
  snapshot.bounds = bounds_;
  std::lock_guard lock(mutex_);
  uint64_t running = 0;
  for (uint64_t count : counts_) {
    running += count;
    snapshot.cumulative_counts.push_back(running);
  }
  snapshot.count = running;
  snapshot.sum = sum_;
  return snapshot;
}

Registry::Family& Registry::family(const std::string& name, const std::string& help, Type type) {
  auto [it, inserted] = families_.try_emplace(name);
  if (inserted) {
    it->second.type = type;
    it->second.help = help;
  }
  PDS_CHECK(it->second.type == type, "metric " + name + " registered with two types");
  return it->second;
}

Counter& Registry::counter(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard lock(mutex_);
  auto& slot = family(name, help, Type::kCounter).counters[render_labels(labels)];
  if (!slot) slot = std::make_unique<Counter>();
  return *slot;
}

Gauge& Registry::gauge(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard lock(mutex_);
  auto& slot = family(name, help, Type::kGauge).gauges[render_labels(labels)];
  if (!slot) slot = std::make_unique<Gauge>();
  return *slot;
}

Histogram& Registry::histogram(const std::string& name, const std::string& help,
                               const std::vector<double>& bounds, const Labels& labels) {
  std::lock_guard lock(mutex_);
  Family& fam = family(name, help, Type::kHistogram);
  if (fam.histograms.empty()) fam.bounds = bounds;
  PDS_CHECK(fam.bounds == bounds, "histogram " + name + " asked with other buckets");
  auto& slot = fam.histograms[render_labels(labels)];
  if (!slot) slot = std::make_unique<Histogram>(bounds);
  return *slot;
}

std::string Registry::render() const {
  std::string out;
  std::lock_guard lock(mutex_);
  for (const auto& [name, fam] : families_) {
    out += "# HELP " + name + " " + fam.help + "\n";
    out += "# TYPE " + name + " " + type_name(static_cast<int>(fam.type)) + "\n";
    for (const auto& [labels, series] : fam.counters) {
      out += name + labels + " " + format_number(series->value()) + "\n";
    }
    for (const auto& [labels, series] : fam.gauges) {
      out += name + labels + " " + format_number(series->value()) + "\n";
    }
    for (const auto& [labels, series] : fam.histograms) {
      const Histogram::Snapshot snap = series->snapshot();
      for (size_t i = 0; i <= snap.bounds.size(); ++i) {
        const std::string le =
            i < snap.bounds.size() ? format_number(snap.bounds[i]) : std::string("+Inf");
        out += name + "_bucket" + with_label(labels, "le", le) + " " +
               std::to_string(snap.cumulative_counts[i]) + "\n";
      }
      out += name + "_sum" + labels + " " + format_number(snap.sum) + "\n";
      out += name + "_count" + labels + " " + std::to_string(snap.count) + "\n";
    }
  }
  return out;
}

}  // namespace pdserve::metrics
