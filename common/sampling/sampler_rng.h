// The per-request random generator of the sampler: xoshiro256** seeded through splitmix64.
// Written out here rather than taken from <random> so that a seed gives the same draws on
// every platform and compiler, and so that the state can be saved and moved with a request
// (e.g. from the prefill node to the decode node).
#pragma once

#include <array>
#include <cstdint>

#include "common/core/status.h"
#include "common/sampling/sampling_params.h"

namespace pdserve {

class SamplerRng {
 public:
  using State = std::array<uint64_t, 4>;

  // The four state words are the first four outputs of splitmix64 started at `seed`.
  explicit SamplerRng(uint64_t seed);
  // params.seed when the request set one, otherwise `entropy` (the caller's choice of
  // randomness, e.g. from std::random_device).
  static SamplerRng for_request(const SamplingParams& params, uint64_t entropy) {
    return SamplerRng(params.seed.value_or(entropy));
  }
  // Resumes from a saved state; the all-zero state (a fixed point) is InvalidArgument.
  static Result<SamplerRng> from_state(const State& state);

  const State& state() const { return state_; }
  uint64_t next_u64();
  // Uniform in [0, 1): the top 53 bits of next_u64() scaled by 2^-53.
  double next_unit();

 private:
  SamplerRng() = default;
  State state_{};
};

}  // namespace pdserve
