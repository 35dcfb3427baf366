// Logits and a double-precision reference sampler shared by the sampler tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "common/sampling/sampler_rng.h"

namespace pdserve::testing {

// Gumbel-distributed logits scaled by `scale`: a long right tail like a language model's.
inline std::vector<float> random_logits(size_t vocab_size, uint64_t seed, double scale = 2.0) {
  SamplerRng rng(seed);
  std::vector<float> logits(vocab_size);
  for (float& logit : logits) {
    double u = (static_cast<double>(rng.next_u64() >> 11) + 0.5) * 0x1.0p-53;  // (0, 1)
    logit = static_cast<float>(-scale * std::log(-std::log(u)));
  }
  return logits;
}

// The kept set and probabilities of sampler.h step 5, computed independently in double with
// full sorts. `margin` is the smallest relative distance of any cut-off decision from its
// threshold: a test only relies on exact agreement with the float implementation when the
// margin is comfortably above float rounding.
struct ReferenceDistribution {
  std::vector<int32_t> tokens;  // ascending
  std::vector<double> probabilities;
  double margin = std::numeric_limits<double>::infinity();
};

inline ReferenceDistribution reference_distribution(const std::vector<float>& logits,
                                                    double temperature, int top_k, double top_p,
                                                    double min_p) {
  const size_t n = logits.size();
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  std::vector<double> weight(n);
  for (size_t i = 0; i < n; ++i) weight[i] = std::exp((logits[i] - max_logit) / temperature);

  ReferenceDistribution result;
  std::vector<bool> kept(n, true);
  for (size_t i = 0; i < n; ++i) {
    if (std::isinf(logits[i])) kept[i] = false;
    if (min_p > 0) {
      result.margin = std::min(result.margin, std::abs(weight[i] - min_p));
      if (weight[i] < min_p) kept[i] = false;
    }
  }
  if (top_k >= 1 && static_cast<size_t>(top_k) < n) {
    std::vector<float> sorted = logits;
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    const float kth = sorted[top_k - 1];
    for (size_t i = 0; i < n; ++i) {
      if (logits[i] < kth) kept[i] = false;
    }
  }
  std::vector<int32_t> order;
  for (size_t i = 0; i < n; ++i) {
    if (kept[i]) order.push_back(static_cast<int32_t>(i));
  }
  if (top_p < 1.0) {
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return weight[a] > weight[b] || (weight[a] == weight[b] && a < b);
    });
    double total = 0;
    for (int32_t token : order) total += weight[token];
    const double target = top_p * total;
    double mass = 0;
    size_t keep = order.size();
    for (size_t j = 0; j < order.size(); ++j) {
      result.margin = std::min(result.margin, std::abs(mass - target) / total);
      mass += weight[order[j]];
      result.margin = std::min(result.margin, std::abs(mass - target) / total);
      if (mass >= target) {
        keep = j + 1;
        break;
      }
    }
    order.resize(keep);
    std::sort(order.begin(), order.end());
  }
  double total = 0;
  for (int32_t token : order) total += weight[token];
  for (int32_t token : order) {
    result.tokens.push_back(token);
    result.probabilities.push_back(weight[token] / total);
  }
  return result;
}

}  // namespace pdserve::testing
