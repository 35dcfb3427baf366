#include "common/model/counter_rng.h"

#include <array>
#include <bit>
#include <cmath>

namespace pdserve {
namespace {

constexpr double kLn2 = 0.693147180559945309417232121458176568;
constexpr double kSqrt2 = 1.41421356237309504880168872420969808;
constexpr double kHalfPi = 1.57079632679489661923132169163975144;
constexpr double kTwoToMinus53 = 1.0 / 9007199254740992.0;
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// 1 / (2k + 1): the atanh series. Constant-evaluated, so no division at run time.
constexpr auto kAtanhCoefficients = [] {
  std::array<double, 7> c{};
  for (int k = 0; k < 7; ++k) c[k] = 1.0 / (2 * k + 1);
  return c;
}();
// 1 / (n (n - 1)): ratios of successive Taylor terms of cos (n = 2k) and sin (n = 2k + 1).
constexpr auto kTaylorRatios = [] {
  std::array<double, 14> c{};
  for (int n = 2; n < 14; ++n) c[n] = 1.0 / (static_cast<double>(n) * (n - 1));
  return c;
}();

// cos t and sin t for t in [0, pi/4]: Taylor to t^12 / t^13 (error below 1e-12).
void sincos_small(double t, double& sine, double& cosine) {
  double t2 = t * t;
  double c = 1.0;
  double s = 1.0;
  for (int k = 6; k >= 1; --k) {
    c = 1.0 - t2 * kTaylorRatios[2 * k] * c;
    s = 1.0 - t2 * kTaylorRatios[2 * k + 1] * s;
  }
  cosine = c;
  sine = t * s;
}

}  // namespace

uint64_t mix64(uint64_t x) {
  x += kGolden;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash_name(std::string_view name) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (char c : name) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

double portable_log_unit(double x) {
  // x = m * 2^e with m in [sqrt(1/2), sqrt(2)); ln m = 2 atanh(s), s = (m-1)/(m+1), |s| < 0.172.
  uint64_t bits = std::bit_cast<uint64_t>(x);
  int exponent = static_cast<int>((bits >> 52) & 0x7ff) - 1023;
  double mantissa = std::bit_cast<double>((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
  if (mantissa > kSqrt2) {
    mantissa *= 0.5;
    exponent += 1;
  }
  double s = (mantissa - 1.0) / (mantissa + 1.0);
  double s2 = s * s;
  // atanh(s)/s = sum s^(2k)/(2k+1); the first omitted term (k = 7) is below 1e-11.
  double series = kAtanhCoefficients[6];
  for (int k = 5; k >= 0; --k) series = series * s2 + kAtanhCoefficients[k];
  return 2.0 * s * series + exponent * kLn2;
}

void portable_sincos_two_pi(double u, double& sine, double& cosine) {
  // 2*pi*u = quadrant * pi/2 + f * pi/2; 4u and f are exact. Fold f into [0, 1/2] so the
  // Taylor argument stays within [0, pi/4].
  double scaled = 4.0 * u;
  int quadrant = static_cast<int>(scaled);
  double f = scaled - quadrant;
  double s, c;
  if (f <= 0.5) {
    sincos_small(f * kHalfPi, s, c);
  } else {
    sincos_small((1.0 - f) * kHalfPi, c, s);
  }
  switch (quadrant & 3) {
    case 0:
      sine = s;
      cosine = c;
      break;
    case 1:
      sine = c;
      cosine = -s;
      break;
    case 2:
      sine = -s;
      cosine = -c;
      break;
    default:
      sine = -c;
      cosine = s;
      break;
  }
}

CounterNormal::CounterNormal(uint64_t seed, uint64_t stream) : key_(mix64(seed ^ mix64(stream))) {}

void CounterNormal::pair(uint64_t pair_index, double& even, double& odd) const {
  uint64_t a = mix64(key_ ^ (2 * pair_index));
  uint64_t b = mix64(key_ ^ (2 * pair_index + 1) ^ kGolden);
  double u1 = static_cast<double>((a >> 11) + 1) * kTwoToMinus53;  // (0, 1]
  double u2 = static_cast<double>(b >> 11) * kTwoToMinus53;        // [0, 1)
  double radius = std::sqrt(-2.0 * portable_log_unit(u1));
  double sine, cosine;
  portable_sincos_two_pi(u2, sine, cosine);
  even = radius * cosine;
  odd = radius * sine;
}

double CounterNormal::sample(uint64_t index) const {
  double even, odd;
  pair(index / 2, even, odd);
  return index % 2 == 0 ? even : odd;
}

void CounterNormal::fill(uint64_t first, size_t count, double mean, double stddev,
                         float* out) const {
  size_t k = 0;
  if (count > 0 && first % 2 == 1) {
    out[k++] = static_cast<float>(mean + stddev * sample(first));
  }
  for (; k + 1 < count; k += 2) {
    double even, odd;
    pair((first + k) / 2, even, odd);
    out[k] = static_cast<float>(mean + stddev * even);
    out[k + 1] = static_cast<float>(mean + stddev * odd);
  }
  if (k < count) out[k] = static_cast<float>(mean + stddev * sample(first + k));
}

}  // namespace pdserve
