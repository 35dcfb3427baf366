// Counter-based random numbers: each value is a pure function of (seed, stream, index), so
// output does not depend on thread count or order. Only integer hashing and IEEE-754 +, -, *,
// /, sqrt are used (no libm transcendental functions, whose last bits vary between libraries),
// so values are bit-identical on every conforming machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace pdserve {

// SplitMix64 finaliser: a bijective 64-bit mixer.
uint64_t mix64(uint64_t x);
// FNV-1a, to turn a tensor name into a stream id.
uint64_t hash_name(std::string_view name);

// Standard normal samples N(0, 1) by Box-Muller: one pair of hashed uniforms gives elements
// 2p (cosine branch) and 2p + 1 (sine branch).
class CounterNormal {
 public:
  CounterNormal(uint64_t seed, uint64_t stream);
  double sample(uint64_t index) const;
  // out[k] = float(mean + stddev * sample(first + k)) for k < count.
  void fill(uint64_t first, size_t count, double mean, double stddev, float* out) const;

 private:
  void pair(uint64_t pair_index, double& even, double& odd) const;
  uint64_t key_;
};

// Deterministic natural log for x in (0, 1], and cos/sin of 2*pi*u for u in [0, 1) (both
// accurate to ~1e-12); exposed so tests can hold them against libm.
double portable_log_unit(double x);
void portable_sincos_two_pi(double u, double& sine, double& cosine);

}  // namespace pdserve
