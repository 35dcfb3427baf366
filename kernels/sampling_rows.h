// The per-row sampling algorithm of the CUDA sampler (sampling_cuda.cu), in pieces that host
// and device share: the row's arguments, the float operations of sampler.h's steps 2-5 (with
// the rounding the host sampler has: no fused multiply-adds), and the decisions of the radix
// selections and the draw. The kernel runs them one thread block per row; the CPU test
// (tests/kernels/device_sampling_rows_test.cpp) runs the same pieces in plain loops and checks
// them against common/sampling/sampler.h, which is the specification.
//
// The row algorithm, after the grammar mask (bit clear: -inf) and the validity check:
//  1. logit_bias, banned ids (-inf), repetition then frequency/presence penalties, from lists
//     of distinct ids the host packed (sampling_inputs.h), so no two threads touch one logit;
//  2. the argmax, ties to the lowest id (greedy rows stop here: exact);
//  3. top_k: the k-th largest logit by a radix selection over order-preserving 32-bit keys,
//     8 bits per pass, counting repeats (exact);
//  4. each kept token's weight w = exp((l - l_max) / T) replaces its logit (0: dropped by the
//     threshold, min_p, or underflow);
//  5. top_p: the weight W* of the last token of the heaviest-first prefix reaching top_p of the
//     kept mass, by a radix selection over the weights' keys whose per-bin masses are summed in
//     64-bit fixed point (integer sums do not depend on the order threads add them, so a seed
//     gives the same tokens run after run); the tokens tied at W* are taken lowest id first;
//  6. the draw: the kept weights summed in double in ascending id order (per-thread chunks,
//     then a scan), the first token whose running sum exceeds u * total.
// Against the host sampler (float weights from std::exp, sums in double in one order): the
// greedy token is identical; a sampled token is identical except when a threshold decision
// (min_p, the top-p cut, the draw's crossing) lies within rounding of its boundary: the
// weights differ by at most 2 ulp (expf vs std::exp), the top-p masses by the fixed point's
// resolution (kMassFractionBits) per token, the draw's sums by double rounding.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#ifndef PDS_HOST_DEVICE  // as common/core/kv_layout.h defines it
#if defined(__CUDACC__)
#define PDS_HOST_DEVICE __host__ __device__
#else
#define PDS_HOST_DEVICE
#endif
#endif

namespace pdserve::sampling {

inline constexpr int kRadixBits = 8;
inline constexpr int kRadixBins = 1 << kRadixBits;
inline constexpr int kRadixPasses = 32 / kRadixBits;

// RowArgs::flags.
enum RowFlag : uint32_t {
  kRowSkip = 1u << 0,    // nothing to sample (a row left to the host, or not wanted)
  kRowGreedy = 1u << 1,  // the argmax; no draw
  kRowForced = 1u << 2,  // scripted output: forced_token after the checks
};

// RowResult::status.
enum RowStatus : int32_t {
  kRowOk = 0,
  kRowInvalidLogits = 1,    // NaN or +inf
  kRowAllMasked = 2,        // every logit -inf after masking
  kRowPenaltyOverflow = 3,  // a penalty made a logit +inf
  kRowBadList = 4,          // a packed id outside the vocabulary (a packing bug)
};

// One row's sampling arguments, packed by the host (sampling_inputs.cpp). Lists are offsets
// into the step's int32 list area; pairs are two ints each.
struct RowArgs {
  double unit = 0.0;  // u in [0, 1) when the row draws
  int32_t logits_row = 0;
  uint32_t flags = 0;
  int32_t forced_token = 0;
  int32_t top_k = 0;  // 0: no top-k (the host passes 0 for -1 and for k >= vocab)
  float temperature = 1.0f;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition = 1.0f;
  float frequency = 0.0f;
  float presence = 0.0f;
  int32_t bias_offset = 0;  // (token, bias bits) pairs
  int32_t bias_count = 0;
  int32_t banned_offset = 0;  // tokens
  int32_t banned_count = 0;
  int32_t repetition_offset = 0;  // distinct tokens of prompt + output
  int32_t repetition_count = 0;
  int32_t frequency_offset = 0;  // (token, count) pairs, distinct tokens of the output
  int32_t frequency_count = 0;
};

struct RowResult {
  int32_t token = 0;
  int32_t status = kRowOk;
};

// ---- float operations, rounded as the host sampler rounds them ------------------------------

PDS_HOST_DEVICE inline uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
#endif
}

PDS_HOST_DEVICE inline float bits_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
#endif
}

// Each operation rounded on its own: nvcc would otherwise fuse a * b - c into one FMA, which
// the host sampler (no -mfma) never does.
PDS_HOST_DEVICE inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
PDS_HOST_DEVICE inline float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
PDS_HOST_DEVICE inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
PDS_HOST_DEVICE inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

PDS_HOST_DEVICE inline float negative_infinity() {
  return bits_float(0xff800000u);
}
PDS_HOST_DEVICE inline float positive_infinity() {
  return bits_float(0x7f800000u);
}
// NaN fails the comparison too.
PDS_HOST_DEVICE inline bool is_valid_logit(float x) {
  return x < positive_infinity();
}

// Step 2 and 3 of sampler.h, one token at a time.
PDS_HOST_DEVICE inline float repetition_penalized(float logit, float penalty) {
  return logit > 0.0f ? div_rn(logit, penalty) : mul_rn(logit, penalty);
}
PDS_HOST_DEVICE inline float frequency_penalized(float logit, float frequency, int32_t count,
                                                 float presence) {
  return sub_rn(sub_rn(logit, mul_rn(frequency, static_cast<float>(count))), presence);
}

// Step 5's weight of a token with `logit`, or 0 when a cut drops it: -inf, below the top-k
// `threshold`, underflowed, or below min_p.
PDS_HOST_DEVICE inline float kept_weight(float logit, float max_logit, float temperature,
                                         float threshold, float min_p) {
  if (logit == negative_infinity() || logit < threshold) return 0.0f;
#if defined(__CUDA_ARCH__)
  const float weight = expf(div_rn(sub_rn(logit, max_logit), temperature));
#else
  const float weight = std::exp(div_rn(sub_rn(logit, max_logit), temperature));
#endif
  if (weight == 0.0f || weight < min_p) return 0.0f;
  return weight;
}

// ---- radix selection ------------------------------------------------------------------------

// A key whose unsigned order is the float order (-inf lowest); NaN never reaches here.
PDS_HOST_DEVICE inline uint32_t order_key(float x) {
  const uint32_t bits = float_bits(x);
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}
PDS_HOST_DEVICE inline float key_float(uint32_t key) {
  return bits_float((key & 0x80000000u) != 0 ? key & 0x7fffffffu : ~key);
}

// The digit of `key` that pass `pass` (0 = most significant) histograms.
PDS_HOST_DEVICE inline int radix_digit(uint32_t key, int pass) {
  return static_cast<int>((key >> (32 - kRadixBits * (pass + 1))) & (kRadixBins - 1));
}
// The bits earlier passes fixed, for matching a key against the selection's prefix.
PDS_HOST_DEVICE inline uint32_t radix_prefix_mask(int pass) {
  return pass == 0 ? 0u : ~0u << (32 - kRadixBits * pass);
}
PDS_HOST_DEVICE inline uint32_t with_digit(uint32_t prefix, int pass, int digit) {
  return prefix | (static_cast<uint32_t>(digit) << (32 - kRadixBits * (pass + 1)));
}

// Top-k, one pass: among the keys matching the prefix, histogrammed by digit, the bin holding
// the `rank`-th largest (1-based); `rank` becomes its rank within that bin.
PDS_HOST_DEVICE inline int choose_rank_bin(const uint32_t* counts, uint32_t& rank) {
  for (int bin = kRadixBins - 1; bin >= 0; --bin) {
    if (counts[bin] >= rank) return bin;
    rank -= counts[bin];
  }
  return 0;  // fewer keys than rank: not reached for 1 <= rank <= matching keys
}

// Top-p masses in 64-bit fixed point with this many fraction bits: a weight is at most 1 and
// a vocabulary below 2^(63 - kMassFractionBits) tokens cannot overflow the sum. (unsigned long
// long: the type of CUDA's 64-bit atomicAdd.)
using Mass = unsigned long long;
inline constexpr int kMassFractionBits = 44;
inline constexpr int kMaxTopPVocab = 1 << (63 - kMassFractionBits);

PDS_HOST_DEVICE inline Mass fixed_mass(float weight) {
  return static_cast<Mass>(static_cast<double>(weight) *
                           static_cast<double>(Mass{1} << kMassFractionBits));
}

// The mass top_p of `total` must reach (the host's target top_p * total, in fixed point).
PDS_HOST_DEVICE inline Mass top_p_target(float top_p, Mass total) {
  return static_cast<Mass>(static_cast<double>(top_p) * static_cast<double>(total));
}

// Top-p, one pass over the weights' keys (heaviest first): `above` is the mass of every kept
// token heavier than the keys matching the prefix. Chooses the bin where the heaviest-first
// mass reaches `target` and adds the mass of the bins above it to `above`. When rounding keeps
// every bin short of the target, the lightest non-empty bin (the whole set is kept).
PDS_HOST_DEVICE inline int choose_mass_bin(const uint32_t* counts, const Mass* masses, Mass target,
                                           Mass& above) {
  int lightest = -1;
  Mass before_lightest = above;
  Mass running = above;
  for (int bin = kRadixBins - 1; bin >= 0; --bin) {
    if (counts[bin] == 0) continue;
    if (running + masses[bin] >= target) {
      above = running;
      return bin;
    }
    lightest = bin;
    before_lightest = running;
    running += masses[bin];
  }
  above = before_lightest;
  return lightest < 0 ? 0 : lightest;
}

// How many of the `ties` tokens of weight W* (mass `tie_mass` each) the top-p prefix takes:
// the fewest that bring `above` to `target`, at least one, all when even all fall short.
PDS_HOST_DEVICE inline uint32_t ties_needed(Mass above, Mass tie_mass, uint32_t ties, Mass target) {
  if (ties == 0) return 0;
  if (above >= target) return 1;
  if (tie_mass == 0) return ties;  // weights below the fixed point's resolution
  const Mass missing = target - above;
  const Mass needed = (missing + tie_mass - 1) / tie_mass;
  if (needed < 1) return 1;
  return needed > ties ? ties : static_cast<uint32_t>(needed);
}

// Whether a token of weight w and id `token` stays after the top-p cut at (cut_weight,
// cut_token): heavier, or as heavy and not after it in id order.
PDS_HOST_DEVICE inline bool survives_top_p(float weight, int32_t token, float cut_weight,
                                           int32_t cut_token) {
  return weight > cut_weight || (weight == cut_weight && token <= cut_token);
}

// ---- the draw -------------------------------------------------------------------------------

// The ids [first, end) a thread of `threads` owns in the draw's id-ordered walk.
PDS_HOST_DEVICE inline void draw_chunk(int vocab, int thread, int threads, int& first, int& end) {
  const int per_thread = (vocab + threads - 1) / threads;
  first = thread * per_thread < vocab ? thread * per_thread : vocab;
  end = first + per_thread < vocab ? first + per_thread : vocab;
}

}  // namespace pdserve::sampling
