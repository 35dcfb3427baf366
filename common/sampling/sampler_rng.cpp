#include "common/sampling/sampler_rng.h"

#include <bit>

namespace pdserve {
namespace {

uint64_t splitmix64_next(uint64_t& x) {
  x += 0x9e3779b97f4a7c15ull;
  uint64_t z = x;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

SamplerRng::SamplerRng(uint64_t seed) {
  // splitmix64 never yields four zero words in a row, so the state is always valid.
  for (uint64_t& word : state_) word = splitmix64_next(seed);
}

Result<SamplerRng> SamplerRng::from_state(const State& state) {
  if (state == State{}) return invalid_argument("sampler RNG state must not be all zero");
  SamplerRng rng;
  rng.state_ = state;
  return rng;
}

uint64_t SamplerRng::next_u64() {
  State& s = state_;
  const uint64_t result = std::rotl(s[1] * 5, 7) * 9;
  const uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = std::rotl(s[3], 45);
  return result;
}

double SamplerRng::next_unit() {
  return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
}

}  // namespace pdserve
