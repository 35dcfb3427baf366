// The rule a device sampler's token is held to against common/sampling/sampler.h (the host
// Sampler, the specification), shared by the CPU test of the kernel's algorithm and the GPU
// test of the kernel itself:
//  * greedy and scripted rows, and every error: exactly the host's result;
//  * sampled rows: the host's token for the same u, or, when that differs, the host's token for
//    some u' in {u - kUnitSlack, u + kUnitSlack} with top_p and min_p each moved by a relative
//    kCutSlack or not at all (27 host draws). Those are the boundary decisions float rounding
//    can flip: the draw's crossing (sums in another order), the top-p cut (fixed-point masses)
//    and the min_p cut (expf on the device within 2 ulp of std::exp). top_k and the penalties
//    are exact on both, so they are never relaxed.
// Anything else is a wrong kernel.
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <span>
#include <vector>

#include "common/sampling/sampler.h"

namespace pdserve::testing {

inline constexpr double kUnitSlack = 1e-5;
inline constexpr double kCutSlack = 1e-5;

// Whether `token` is acceptable for a device sample of `logits` (already masked by a grammar)
// with draw `unit`; `exact` says whether it is the host's own token.
inline bool acceptable_sample(Sampler& sampler, std::span<const float> logits,
                              const SamplingParams& params, std::span<const int32_t> prompt,
                              std::span<const int32_t> output, std::span<const int32_t> banned,
                              double unit, int32_t token, bool& exact) {
  const Result<SampleResult> host =
      sampler.sample_with_unit(logits, params, prompt, output, unit, banned);
  exact = host.ok() && host->token == token;
  if (exact || !host.ok() || !sampler_draws(params, output.size())) return exact;
  std::set<int32_t> near;
  for (double unit_step : {-kUnitSlack, 0.0, kUnitSlack}) {
    const double moved_unit = std::min(std::max(unit + unit_step, 0.0), 1.0 - 1e-16);
    for (double top_p_step : {-kCutSlack, 0.0, kCutSlack}) {
      for (double min_p_step : {-kCutSlack, 0.0, kCutSlack}) {
        SamplingParams moved = params;
        moved.top_p = static_cast<float>(
            std::min(1.0, static_cast<double>(params.top_p) * (1.0 + top_p_step)));
        moved.min_p = static_cast<float>(static_cast<double>(params.min_p) * (1.0 + min_p_step));
        const Result<SampleResult> nearby =
            sampler.sample_with_unit(logits, moved, prompt, output, moved_unit, banned);
        if (nearby.ok()) near.insert(nearby->token);
      }
    }
  }
  return near.contains(token);
}

}  // namespace pdserve::testing
