// The CUDA sampler's algorithm on the CPU. The kernel (kernels/sampling_cuda.cu) is a thread
// block per row running the shared pieces of kernels/sampling_rows.h; emulate_row() below runs
// the same pieces in plain loops (the draw over 512 thread chunks like the kernel's), fed by
// the production packer (SamplingInputPacker). Both are checked against the host Sampler,
// the specification: greedy rows, scripted rows, errors, penalties and top-k exactly; sampled
// rows by the rule of sampling_check.h; the generator advanced exactly when the host's is.
// tests/kernels_gpu/device_sampler_test.cpp holds the kernel itself to the same rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "common/sampling/sampler.h"
#include "kernels/model/sampling_inputs.h"
#include "kernels/sampling_rows.h"
#include "tests/kernels/sampling_check.h"

namespace pdserve {
namespace {

using sampling::RowArgs;
using sampling::RowResult;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kEmulatedThreads = 512;

bool allowed_by(std::span<const int32_t> mask, size_t token) {
  return ((static_cast<uint32_t>(mask[token / 32]) >> (token % 32)) & 1u) != 0;
}

// The kernel's algorithm for one row, in loops; `logits` is overwritten as the kernel
// overwrites the device row. `kept`, when given, receives the tokens left for the draw.
RowResult emulate_row(std::vector<float>& logits, const RowArgs& args,
                      std::span<const int32_t> lists, std::span<const int32_t> mask = {},
                      std::vector<int32_t>* kept = nullptr) {
  const int vocab = static_cast<int>(logits.size());
  if ((args.flags & sampling::kRowSkip) != 0) return {0, sampling::kRowOk};
  bool invalid = false;
  for (int i = 0; i < vocab; ++i) {
    if (!mask.empty() && !allowed_by(mask, static_cast<size_t>(i))) logits[i] = kNegInf;
    invalid |= !sampling::is_valid_logit(logits[i]);
  }
  if (invalid) return {0, sampling::kRowInvalidLogits};

  bool bad = false;
  bool overflow = false;
  const auto in_range = [&](int32_t token) {
    bad |= token < 0 || token >= vocab;
    return token >= 0 && token < vocab;
  };
  for (int e = 0; e < args.bias_count; ++e) {
    const int32_t token = lists[args.bias_offset + 2 * e];
    if (in_range(token)) {
      logits[token] = sampling::add_rn(
          logits[token],
          sampling::bits_float(static_cast<uint32_t>(lists[args.bias_offset + 2 * e + 1])));
    }
  }
  for (int e = 0; e < args.banned_count; ++e) {
    const int32_t token = lists[args.banned_offset + e];
    if (in_range(token)) logits[token] = kNegInf;
  }
  for (int e = 0; e < args.repetition_count; ++e) {
    const int32_t token = lists[args.repetition_offset + e];
    if (!in_range(token)) continue;
    logits[token] = sampling::repetition_penalized(logits[token], args.repetition);
    overflow |= logits[token] == sampling::positive_infinity();
  }
  for (int e = 0; e < args.frequency_count; ++e) {
    const int32_t token = lists[args.frequency_offset + 2 * e];
    if (!in_range(token)) continue;
    logits[token] = sampling::frequency_penalized(
        logits[token], args.frequency, lists[args.frequency_offset + 2 * e + 1], args.presence);
    overflow |= logits[token] == sampling::positive_infinity();
  }
  if (bad) return {0, sampling::kRowBadList};
  if (overflow) return {0, sampling::kRowPenaltyOverflow};

  int best = 0;
  for (int i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  const float max_logit = logits[best];
  if (max_logit == kNegInf) return {0, sampling::kRowAllMasked};
  if ((args.flags & sampling::kRowForced) != 0) return {args.forced_token, sampling::kRowOk};
  if ((args.flags & sampling::kRowGreedy) != 0) return {best, sampling::kRowOk};

  float threshold = kNegInf;
  if (args.top_k > 0) {
    uint32_t prefix = 0;
    uint32_t rank = static_cast<uint32_t>(args.top_k);
    for (int pass = 0; pass < sampling::kRadixPasses; ++pass) {
      uint32_t counts[sampling::kRadixBins] = {};
      for (int i = 0; i < vocab; ++i) {
        const uint32_t key = sampling::order_key(logits[i]);
        if ((key & sampling::radix_prefix_mask(pass)) == prefix) {
          ++counts[sampling::radix_digit(key, pass)];
        }
      }
      prefix = sampling::with_digit(prefix, pass, sampling::choose_rank_bin(counts, rank));
    }
    threshold = sampling::key_float(prefix);
  }

  sampling::Mass total_mass = 0;
  for (int i = 0; i < vocab; ++i) {
    logits[i] =
        sampling::kept_weight(logits[i], max_logit, args.temperature, threshold, args.min_p);
    if (logits[i] > 0.0f) total_mass += sampling::fixed_mass(logits[i]);
  }

  if (args.top_p < 1.0f) {
    const sampling::Mass target = sampling::top_p_target(args.top_p, total_mass);
    uint32_t prefix = 0;
    sampling::Mass above = 0;
    uint32_t ties = 0;
    for (int pass = 0; pass < sampling::kRadixPasses; ++pass) {
      uint32_t counts[sampling::kRadixBins] = {};
      sampling::Mass masses[sampling::kRadixBins] = {};
      for (int i = 0; i < vocab; ++i) {
        if (logits[i] <= 0.0f) continue;
        const uint32_t key = sampling::order_key(logits[i]);
        if ((key & sampling::radix_prefix_mask(pass)) != prefix) continue;
        ++counts[sampling::radix_digit(key, pass)];
        masses[sampling::radix_digit(key, pass)] += sampling::fixed_mass(logits[i]);
      }
      const int bin = sampling::choose_mass_bin(counts, masses, target, above);
      prefix = sampling::with_digit(prefix, pass, bin);
      ties = counts[bin];
    }
    const float cut_weight = sampling::key_float(prefix);
    const uint32_t needed =
        sampling::ties_needed(above, sampling::fixed_mass(cut_weight), ties, target);
    int cut_token = std::numeric_limits<int>::max();
    uint32_t seen = 0;
    for (int i = 0; i < vocab; ++i) {
      if (logits[i] == cut_weight && ++seen == needed) {
        cut_token = i;
        break;
      }
    }
    for (int i = 0; i < vocab; ++i) {
      if (logits[i] > 0.0f && !sampling::survives_top_p(logits[i], i, cut_weight, cut_token)) {
        logits[i] = 0.0f;
      }
    }
  }

  if (kept != nullptr) {
    kept->clear();
    for (int i = 0; i < vocab; ++i) {
      if (logits[i] > 0.0f) kept->push_back(i);
    }
  }
  // The draw over the kernel's thread chunks: chunk sums, their prefix in thread order.
  std::vector<double> chunk(kEmulatedThreads, 0.0);
  int last_kept = -1;
  for (int t = 0; t < kEmulatedThreads; ++t) {
    int first = 0;
    int end = 0;
    sampling::draw_chunk(vocab, t, kEmulatedThreads, first, end);
    for (int i = first; i < end; ++i) {
      if (logits[i] > 0.0f) {
        chunk[t] += static_cast<double>(logits[i]);
        last_kept = i;
      }
    }
  }
  double total = 0.0;
  std::vector<double> before(kEmulatedThreads, 0.0);
  for (int t = 0; t < kEmulatedThreads; ++t) {
    before[t] = total;
    total += chunk[t];
  }
  const double target = args.unit * total;
  int claim = std::numeric_limits<int>::max();
  for (int t = 0; t < kEmulatedThreads && claim == std::numeric_limits<int>::max(); ++t) {
    if (!(before[t] + chunk[t] > target)) continue;
    int first = 0;
    int end = 0;
    sampling::draw_chunk(vocab, t, kEmulatedThreads, first, end);
    double running = before[t];
    for (int i = first; i < end; ++i) {
      if (logits[i] <= 0.0f) continue;
      running += static_cast<double>(logits[i]);
      if (running > target) {
        claim = i;
        break;
      }
    }
  }
  const int token = claim != std::numeric_limits<int>::max() ? claim : last_kept;
  return {token, token >= 0 ? sampling::kRowOk : sampling::kRowAllMasked};
}

// One packed row: the packer's output for `row`, ready for emulate_row().
struct PackedRow {
  std::vector<std::byte> area;
  PackedSampling packed;
  SampleOutcome outcome = SampleOutcome::kSampled;
  const RowArgs& args() const { return *reinterpret_cast<const RowArgs*>(area.data()); }
  std::span<const int32_t> lists() const {
    return {reinterpret_cast<const int32_t*>(area.data() + packed.lists_offset),
            (area.size() - packed.lists_offset) / sizeof(int32_t)};
  }
};

PackedRow pack_one(int vocab, const SamplingRow& row, size_t area_bytes = size_t{1} << 20) {
  PackedRow out;
  out.area.resize(area_bytes);
  SamplingInputPacker packer(vocab);
  const int32_t logits_row = 0;
  std::span<SampleOutcome> outcomes(&out.outcome, 1);
  Result<PackedSampling> packed = packer.pack({&row, 1}, {&logits_row, 1}, out.area, outcomes);
  EXPECT_TRUE(packed.ok()) << packed.status().to_string();
  if (packed.ok()) out.packed = *packed;
  return out;
}

std::vector<float> gumbel_logits(size_t vocab, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> uniform(1e-12, 1.0);
  std::vector<float> logits(vocab);
  for (float& logit : logits)
    logit = static_cast<float>(-scale * std::log(-std::log(uniform(rng))));
  return logits;
}

// A random row of every kind the engine sends: greedy or sampled, scripted, with bias, bans
// and penalties over a history.
struct RandomCase {
  std::vector<float> logits;
  SamplingParams params;
  std::vector<int32_t> prompt, output, banned;
  uint64_t seed = 0;
};

RandomCase random_case(int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  const auto chance = [&](double p) { return std::uniform_real_distribution<>(0, 1)(rng) < p; };
  const auto token = [&] { return static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab)); };
  RandomCase c;
  c.seed = rng();
  c.logits = gumbel_logits(static_cast<size_t>(vocab), seed, chance(0.5) ? 1.0f : 4.0f);
  SamplingParams& p = c.params;
  p.temperature = chance(0.2) ? 0.0f : std::uniform_real_distribution<float>(0.3f, 1.5f)(rng);
  if (chance(0.5)) p.top_k = 1 + static_cast<int>(rng() % 64);
  if (chance(0.5)) p.top_p = std::uniform_real_distribution<float>(0.05f, 0.99f)(rng);
  if (chance(0.3)) p.min_p = std::uniform_real_distribution<float>(0.0f, 0.3f)(rng);
  if (chance(0.3)) p.repetition_penalty = std::uniform_real_distribution<float>(0.7f, 1.5f)(rng);
  if (chance(0.3)) p.frequency_penalty = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
  if (chance(0.3)) p.presence_penalty = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
  const int history = static_cast<int>(rng() % 40);
  for (int i = 0; i < history; ++i) c.prompt.push_back(token());
  const int outputs = static_cast<int>(rng() % 20);
  for (int i = 0; i < outputs; ++i)
    c.output.push_back(chance(0.3) && !c.output.empty() ? c.output[0] : token());
  if (chance(0.3)) c.banned = {token(), token() == 0 ? 1 : 0};
  std::sort(c.banned.begin(), c.banned.end());
  c.banned.erase(std::unique(c.banned.begin(), c.banned.end()), c.banned.end());
  if (chance(0.3)) {
    std::vector<int32_t> ids;
    for (int i = 0; i < 5; ++i) ids.push_back(token());
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (int32_t id : ids) {
      p.logit_bias.push_back({id, std::uniform_real_distribution<float>(-5.0f, 5.0f)(rng)});
    }
  }
  if (chance(0.1)) p.scripted_output = std::vector<int32_t>(c.output.size() + 1, token());
  return c;
}

TEST(DeviceSamplingRows, RandomRowsAgreeWithTheHostSamplerAndDrawAsOftenAsIt) {
  constexpr int kVocab = 3000;
  constexpr int kCases = 600;
  Sampler sampler;
  int sampled = 0;
  int relaxed = 0;
  for (int n = 0; n < kCases; ++n) {
    const RandomCase c = random_case(kVocab, 1000u + static_cast<uint32_t>(n));
    SamplerRng device_rng(c.seed);
    SamplingRow row{&c.params, c.prompt, c.output, c.banned, &device_rng};
    const PackedRow packed = pack_one(kVocab, row);
    ASSERT_EQ(packed.outcome, SampleOutcome::kSampled) << "case " << n;
    std::vector<float> device_logits = c.logits;
    const RowResult result = emulate_row(device_logits, packed.args(), packed.lists());

    SamplerRng host_rng(c.seed);
    const Result<SampleResult> host =
        sampler.sample(c.logits, c.params, c.prompt, c.output, host_rng, c.banned);
    // The packer draws exactly when the host sampler does.
    EXPECT_EQ(device_rng.state(), host_rng.state()) << "case " << n;
    ASSERT_TRUE(host.ok()) << host.status().to_string();
    ASSERT_EQ(result.status, sampling::kRowOk) << "case " << n;
    if (!sampler_draws(c.params, c.output.size())) {
      EXPECT_EQ(result.token, host->token) << "greedy or scripted case " << n;
      continue;
    }
    ++sampled;
    bool exact = false;
    EXPECT_TRUE(testing::acceptable_sample(sampler, c.logits, c.params, c.prompt, c.output,
                                           c.banned, packed.args().unit, result.token, exact))
        << "case " << n << ": token " << result.token << ", host " << host->token;
    relaxed += exact ? 0 : 1;
  }
  std::printf("  %d sampled rows, %d needed the boundary rule\n", sampled, relaxed);
  EXPECT_GT(sampled, kCases / 2);
  EXPECT_LE(relaxed, sampled / 100) << "boundary cases should be rare";
}

// The kept set itself (before the draw) is the host's distribution() when no cut lies within
// rounding of its boundary: here weights are far apart.
TEST(DeviceSamplingRows, KeptSetIsTheHostDistribution) {
  constexpr int kVocab = 512;
  Sampler sampler;
  for (int n = 0; n < 200; ++n) {
    std::vector<float> logits(kVocab);
    std::mt19937 rng(77u + static_cast<uint32_t>(n));
    // Distinct logits a quarter apart, shuffled: no ties, no boundary within rounding.
    for (int i = 0; i < kVocab; ++i) logits[i] = 0.25f * static_cast<float>(i) - 40.0f;
    std::shuffle(logits.begin(), logits.end(), rng);
    SamplingParams params;
    params.temperature = 0.5f + 0.01f * static_cast<float>(n % 50);
    params.top_k = n % 3 == 0 ? 0 : 1 + n % 200;
    params.top_p = n % 2 == 0 ? 1.0f : 0.1f + 0.004f * static_cast<float>(n);
    params.min_p = n % 5 == 0 ? 0.01f : 0.0f;
    SamplerRng device_rng(static_cast<uint64_t>(n));
    const SamplingRow row{&params, {}, {}, {}, &device_rng};
    const PackedRow packed = pack_one(kVocab, row);
    std::vector<float> device_logits = logits;
    std::vector<int32_t> kept;
    const RowResult result = emulate_row(device_logits, packed.args(), packed.lists(), {}, &kept);
    ASSERT_EQ(result.status, sampling::kRowOk);
    const std::vector<TokenProbability> host = sampler.distribution(logits, params, {}, {}).value();
    std::vector<int32_t> host_tokens;
    for (const TokenProbability& entry : host) host_tokens.push_back(entry.token);
    EXPECT_EQ(kept, host_tokens) << "case " << n;
    EXPECT_TRUE(std::binary_search(kept.begin(), kept.end(), result.token));
  }
}

TEST(DeviceSamplingRows, TopKCountsRepeatsAndKeepsEveryTieAtTheThreshold) {
  // Logits 5, 5, 5, 1, 0: the 2nd largest is 5, so all three 5s stay (sampler.h step 5b).
  const std::vector<float> logits = {5.0f, 1.0f, 5.0f, 0.0f, 5.0f};
  SamplingParams params;
  params.top_k = 2;
  SamplerRng rng(1);
  const PackedRow packed = pack_one(5, {&params, {}, {}, {}, &rng});
  std::vector<float> device_logits = logits;
  std::vector<int32_t> kept;
  ASSERT_EQ(emulate_row(device_logits, packed.args(), packed.lists(), {}, &kept).status,
            sampling::kRowOk);
  EXPECT_EQ(kept, (std::vector<int32_t>{0, 2, 4}));
}

TEST(DeviceSamplingRows, TopPTiesAtTheCutAreTakenLowestIdFirst) {
  // Four tokens of equal weight: top_p 0.5 keeps the two lowest ids (the host's order: weight
  // descending, ties to the lower id).
  const std::vector<float> logits = {kNegInf, 2.0f, 2.0f, kNegInf, 2.0f, 2.0f};
  SamplingParams params;
  params.top_p = 0.5f;
  Sampler sampler;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    SamplerRng rng(seed);
    const PackedRow packed = pack_one(6, {&params, {}, {}, {}, &rng});
    std::vector<float> device_logits = logits;
    std::vector<int32_t> kept;
    const RowResult result = emulate_row(device_logits, packed.args(), packed.lists(), {}, &kept);
    ASSERT_EQ(result.status, sampling::kRowOk);
    std::vector<int32_t> host;
    const std::vector<TokenProbability> distribution =
        sampler.distribution(logits, params, {}, {}).value();
    for (const TokenProbability& entry : distribution) host.push_back(entry.token);
    EXPECT_EQ(kept, host);
    EXPECT_EQ(kept, (std::vector<int32_t>{1, 2}));
    EXPECT_EQ(result.token,
              sampler.sample_with_unit(logits, params, {}, {}, packed.args().unit).value().token);
  }
}

TEST(DeviceSamplingRows, RadixSelectionFindsTheKthLargestExactly) {
  std::mt19937 rng(3);
  for (int n = 0; n < 100; ++n) {
    std::vector<float> values(1 + rng() % 700);
    for (float& v : values) {
      const uint32_t kind = rng() % 10;
      v = kind == 0   ? kNegInf
          : kind == 1 ? 0.0f
          : kind == 2 ? -0.0f
                      : static_cast<float>(static_cast<int>(rng() % 41) - 20) * 0.5f;
    }
    const uint32_t k = 1 + rng() % static_cast<uint32_t>(values.size());
    uint32_t prefix = 0;
    uint32_t rank = k;
    for (int pass = 0; pass < sampling::kRadixPasses; ++pass) {
      uint32_t counts[sampling::kRadixBins] = {};
      for (float v : values) {
        const uint32_t key = sampling::order_key(v);
        if ((key & sampling::radix_prefix_mask(pass)) == prefix) {
          ++counts[sampling::radix_digit(key, pass)];
        }
      }
      prefix = sampling::with_digit(prefix, pass, sampling::choose_rank_bin(counts, rank));
    }
    std::vector<float> sorted = values;
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    EXPECT_EQ(sampling::key_float(prefix), sorted[k - 1]) << "k " << k;
  }
  for (float v : {kNegInf, -3.5f, -0.0f, 0.0f, 1e-30f, 2.0f, 3e38f}) {
    EXPECT_EQ(sampling::key_float(sampling::order_key(v)), v);
  }
  EXPECT_LT(sampling::order_key(-1.0f), sampling::order_key(-0.5f));
  EXPECT_LT(sampling::order_key(kNegInf), sampling::order_key(-3e38f));
  EXPECT_LT(sampling::order_key(0.5f), sampling::order_key(1.0f));
}

// The penalties and edits are the host's float operations, bit for bit.
TEST(DeviceSamplingRows, EditedLogitsEqualTheHostSamplersBitwise) {
  constexpr int kVocab = 400;
  Sampler sampler;
  for (int n = 0; n < 100; ++n) {
    RandomCase c = random_case(kVocab, 5000u + static_cast<uint32_t>(n));
    c.params.temperature = 0.0f;  // greedy: the row stops after the edits and the argmax
    c.params.scripted_output.clear();
    SamplerRng rng(1);
    const PackedRow packed = pack_one(kVocab, {&c.params, c.prompt, c.output, c.banned, &rng});
    std::vector<float> device_logits = c.logits;
    const RowResult result = emulate_row(device_logits, packed.args(), packed.lists());
    std::vector<float> host = c.logits;
    for (const LogitBias& entry : c.params.logit_bias) host[entry.token] += entry.bias;
    for (int32_t token : c.banned) host[token] = kNegInf;
    ASSERT_TRUE(sampler.apply_penalties(host, c.params, c.prompt, c.output).ok());
    for (int i = 0; i < kVocab; ++i) {
      ASSERT_EQ(sampling::float_bits(device_logits[i]), sampling::float_bits(host[i]))
          << "case " << n << " token " << i;
    }
    EXPECT_EQ(result.token, std::max_element(host.begin(), host.end()) - host.begin());
  }
}

TEST(DeviceSamplingRows, ErrorsAreTheHostSamplers) {
  SamplingParams params;
  params.temperature = 0.0f;
  SamplerRng rng(1);
  const PackedRow packed = pack_one(4, {&params, {}, {}, {}, &rng});
  std::vector<float> nan_row = {0.0f, std::nanf(""), 1.0f, 2.0f};
  EXPECT_EQ(emulate_row(nan_row, packed.args(), packed.lists()).status,
            sampling::kRowInvalidLogits);
  std::vector<float> inf_row = {0.0f, std::numeric_limits<float>::infinity(), 1.0f, 2.0f};
  EXPECT_EQ(emulate_row(inf_row, packed.args(), packed.lists()).status,
            sampling::kRowInvalidLogits);
  // A NaN the grammar masks is -inf before the host sampler sees it: no error.
  std::vector<float> masked_nan = {0.0f, std::nanf(""), 1.0f, 2.0f};
  const std::vector<int32_t> mask = {0b1101};
  const RowResult masked = emulate_row(masked_nan, packed.args(), packed.lists(), mask);
  EXPECT_EQ(masked.status, sampling::kRowOk);
  EXPECT_EQ(masked.token, 3);
  std::vector<float> all_masked = {1.0f, 2.0f, 3.0f, 4.0f};
  EXPECT_EQ(emulate_row(all_masked, packed.args(), packed.lists(), std::vector<int32_t>{0}).status,
            sampling::kRowAllMasked);

  // A repetition penalty below 1 overflows a huge logit to +inf: InvalidArgument on the host.
  SamplingParams penalized = params;
  penalized.repetition_penalty = 0.5f;
  const std::vector<int32_t> prompt = {2};
  const PackedRow overflowing = pack_one(4, {&penalized, prompt, {}, {}, &rng});
  std::vector<float> huge = {0.0f, 1.0f, 3e38f, 2.0f};
  EXPECT_EQ(emulate_row(huge, overflowing.args(), overflowing.lists()).status,
            sampling::kRowPenaltyOverflow);
  Sampler sampler;
  const std::vector<float> huge_again = {0.0f, 1.0f, 3e38f, 2.0f};
  EXPECT_EQ(sampler.sample(huge_again, penalized, prompt, {}, rng).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(SamplingInputPacker, DrawsOnlyWhenTheHostSamplerWouldAndLeavesOversizedRowsToTheHost) {
  constexpr int kVocab = 100;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams sampled;
  sampled.temperature = 0.8f;
  SamplingParams scripted = sampled;
  scripted.scripted_output = {7, 8};
  SamplingParams penalized = sampled;
  penalized.repetition_penalty = 1.2f;
  const std::vector<int32_t> output = {5};
  std::vector<int32_t> long_prompt(90);
  for (int i = 0; i < 90; ++i) long_prompt[i] = i;
  const std::vector<int32_t> bad_ids = {3, 100};

  std::vector<SamplerRng> rngs(6, SamplerRng(9));
  const std::vector<SamplingRow> rows = {
      {&greedy, {}, output, {}, &rngs[0]},
      {&sampled, {}, output, {}, &rngs[1]},
      {&scripted, {}, output, {}, &rngs[2]},        // output 1 < 2 scripted: forced, no draw
      {nullptr, {}, {}, {}, &rngs[3]},              // not wanted
      {&penalized, long_prompt, {}, {}, &rngs[4]},  // 90 distinct ids: more than the room left
      {&sampled, bad_ids, {}, {}, &rngs[5]},        // an id outside the vocabulary
  };
  const std::vector<int32_t> logits_rows = {0, 1, 2, 3, 4, 5};
  std::vector<SampleOutcome> outcomes(rows.size());
  SamplingInputPacker packer(kVocab);
  std::vector<std::byte> area(sampling_input_bytes(6, 40));
  const PackedSampling packed = packer.pack(rows, logits_rows, area, outcomes).value();
  const auto* args = reinterpret_cast<const RowArgs*>(area.data());
  const SamplerRng untouched(9);
  SamplerRng drawn(9);
  const double unit = drawn.next_unit();

  EXPECT_EQ(args[0].flags, sampling::kRowGreedy);
  EXPECT_EQ(rngs[0].state(), untouched.state());
  EXPECT_EQ(args[1].flags, 0u);
  EXPECT_EQ(args[1].unit, unit);
  EXPECT_EQ(rngs[1].state(), drawn.state());
  EXPECT_EQ(args[2].flags, sampling::kRowForced);
  EXPECT_EQ(args[2].forced_token, 8);
  EXPECT_EQ(rngs[2].state(), untouched.state());
  EXPECT_EQ(args[3].flags, sampling::kRowSkip);
  EXPECT_EQ(outcomes[3], SampleOutcome::kSampled);
  EXPECT_EQ(args[4].flags, sampling::kRowSkip);
  EXPECT_EQ(outcomes[4], SampleOutcome::kLeftToHost);
  EXPECT_EQ(rngs[4].state(), untouched.state()) << "a row left to the host draws nothing";
  EXPECT_EQ(outcomes[5], SampleOutcome::kLeftToHost);
  EXPECT_EQ(rngs[5].state(), untouched.state());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(args[i].logits_row, i);
  EXPECT_LE(packed.bytes, area.size());

  // The same penalized row fits a larger area and lists each prompt id once.
  std::vector<std::byte> larger(sampling_input_bytes(1, 200));
  SampleOutcome outcome = SampleOutcome::kLeftToHost;
  SamplerRng rng(9);
  const SamplingRow row{&penalized, long_prompt, long_prompt, {}, &rng};
  const int32_t logits_row = 0;
  ASSERT_TRUE(packer.pack({&row, 1}, {&logits_row, 1}, larger, {&outcome, 1}).ok());
  EXPECT_EQ(outcome, SampleOutcome::kSampled);
  EXPECT_EQ(reinterpret_cast<const RowArgs*>(larger.data())->repetition_count, 90);

  std::vector<std::byte> tiny(8);
  EXPECT_EQ(packer.pack(rows, logits_rows, tiny, outcomes).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve
