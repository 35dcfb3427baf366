#include "common/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

namespace pdserve {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();
// Up to this top_k a one-pass heap finds the threshold; above it nth_element on a copy is
// cheaper than the heap's log factor.
constexpr size_t kHeapSelectMaxK = 1024;
// top_p narrows down where its prefix ends by selection, and sorts once this few remain.
constexpr size_t kTopPSortBelow = 256;

Status check_token_ids(std::span<const int32_t> ids, size_t vocab_size, const char* list_name) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || static_cast<size_t>(ids[i]) >= vocab_size) {
      return invalid_argument(std::string(list_name) + "[" + std::to_string(i) +
                              "] = " + std::to_string(ids[i]) + " is outside the vocabulary [0, " +
                              std::to_string(vocab_size) + ")");
    }
  }
  return {};
}

// The lowest index of the largest value, or -1 when every value is -inf.
int32_t argmax(std::span<const float> values) {
  int32_t best = -1;
  float best_value = kNegInf;
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] > best_value) {
      best_value = values[i];
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

// Rejects NaN and +inf logits and returns argmax(logits), in one pass.
Result<int32_t> scan_raw_logits(std::span<const float> logits) {
  int32_t best = -1;
  float best_value = kNegInf;
  bool all_valid = true;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float logit = logits[i];
    all_valid &= logit < kPosInf;  // NaN fails this too
    if (logit > best_value) {
      best_value = logit;
      best = static_cast<int32_t>(i);
    }
  }
  if (all_valid) return best;
  size_t bad = 0;
  while (logits[bad] < kPosInf) ++bad;
  return invalid_argument("logits[" + std::to_string(bad) + "] is " +
                          (std::isnan(logits[bad]) ? "NaN" : "+inf"));
}

double log_sum_exp(std::span<const float> logits, float max_logit) {
  double sum = 0.0;
  for (float value : logits) sum += std::exp(value - max_logit);
  return static_cast<double>(max_logit) + std::log(sum);
}

// The n entries with the largest logits, best first, ties to the lower id; one pass with a
// heap whose front is the worst entry kept so far.
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, size_t n,
                                       double log_normalizer) {
  struct Entry {
    float logit;
    int32_t token;
  };
  auto better = [](const Entry& a, const Entry& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.token < b.token);
  };
  std::vector<Entry> heap;
  if (n == 0) return {};
  heap.reserve(n);
  for (size_t i = 0; i < logits.size(); ++i) {
    Entry entry{logits[i], static_cast<int32_t>(i)};
    if (heap.size() < n) {
      heap.push_back(entry);
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (better(entry, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = entry;
      std::push_heap(heap.begin(), heap.end(), better);
    }
  }
  std::sort_heap(heap.begin(), heap.end(), better);
  std::vector<TokenLogprob> result;
  result.reserve(heap.size());
  for (const Entry& entry : heap) {
    result.push_back(
        {entry.token, static_cast<float>(static_cast<double>(entry.logit) - log_normalizer)});
  }
  return result;
}

// The k-th largest value counting repeats, for 1 <= k < values.size().
float kth_largest(std::span<const float> values, size_t k, std::vector<float>& scratch) {
  scratch.clear();
  if (k <= kHeapSelectMaxK) {
    // Min-heap of the k largest values seen so far.
    for (float value : values) {
      if (scratch.size() < k) {
        scratch.push_back(value);
        std::push_heap(scratch.begin(), scratch.end(), std::greater<float>());
      } else if (value > scratch.front()) {
        std::pop_heap(scratch.begin(), scratch.end(), std::greater<float>());
        scratch.back() = value;
        std::push_heap(scratch.begin(), scratch.end(), std::greater<float>());
      }
    }
    return scratch.front();
  }
  scratch.assign(values.begin(), values.end());
  auto kth = scratch.begin() + static_cast<std::ptrdiff_t>(k - 1);
  std::nth_element(scratch.begin(), kth, scratch.end(), std::greater<float>());
  return *kth;
}

}  // namespace

Status Sampler::apply_penalties(std::span<float> logits, const SamplingParams& params,
                                std::span<const int32_t> prompt_tokens,
                                std::span<const int32_t> output_tokens) {
  const size_t vocab_size = logits.size();
  if (vocab_size > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return invalid_argument("logits hold more than 2^31-1 entries");
  }
  PDS_RETURN_IF_ERROR(params.validate(static_cast<int>(vocab_size)));
  PDS_RETURN_IF_ERROR(check_token_ids(prompt_tokens, vocab_size, "prompt_tokens"));
  PDS_RETURN_IF_ERROR(check_token_ids(output_tokens, vocab_size, "output_tokens"));
  // Errors are reported after the loops so that seen_ and counts_ are always left all zero.
  int64_t overflowed_token = -1;
  auto note_overflow = [&](int32_t token) {
    if (logits[token] == kPosInf && overflowed_token < 0) overflowed_token = token;
  };

  const float repetition = params.repetition_penalty;
  if (repetition != 1.0f) {
    if (seen_.size() < vocab_size) seen_.resize(vocab_size, 0);
    auto penalize = [&](int32_t token) {
      if (seen_[token]) return;
      seen_[token] = 1;
      float& logit = logits[token];
      logit = logit > 0.0f ? logit / repetition : logit * repetition;
      note_overflow(token);
    };
    for (int32_t token : prompt_tokens) penalize(token);
    for (int32_t token : output_tokens) penalize(token);
    for (int32_t token : prompt_tokens) seen_[token] = 0;
    for (int32_t token : output_tokens) seen_[token] = 0;
  }

  const float frequency = params.frequency_penalty;
  const float presence = params.presence_penalty;
  if (frequency != 0.0f || presence != 0.0f) {
    if (counts_.size() < vocab_size) counts_.resize(vocab_size, 0);
    for (int32_t token : output_tokens) ++counts_[token];
    for (int32_t token : output_tokens) {
      if (counts_[token] == 0) continue;  // already penalised
      float& logit = logits[token];
      logit = logit - frequency * static_cast<float>(counts_[token]);
      logit = logit - presence;
      counts_[token] = 0;
      note_overflow(token);
    }
  }

  if (overflowed_token >= 0) {
    return invalid_argument("a penalty overflowed the logit of token " +
                            std::to_string(overflowed_token) + " to +inf");
  }
  return {};
}

Result<Sampler::Processed> Sampler::process_logits(std::span<const float> logits,
                                                   const SamplingParams& params,
                                                   std::span<const int32_t> prompt_tokens,
                                                   std::span<const int32_t> output_tokens,
                                                   std::span<const int32_t> banned_token_ids) {
  if (logits.empty() || logits.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return invalid_argument("logits must hold between 1 and 2^31-1 entries, got " +
                            std::to_string(logits.size()));
  }
  const size_t vocab_size = logits.size();
  PDS_RETURN_IF_ERROR(params.validate(static_cast<int>(vocab_size)));
  PDS_RETURN_IF_ERROR(check_token_ids(prompt_tokens, vocab_size, "prompt_tokens"));
  PDS_RETURN_IF_ERROR(check_token_ids(output_tokens, vocab_size, "output_tokens"));
  PDS_RETURN_IF_ERROR(check_token_ids(banned_token_ids, vocab_size, "banned_token_ids"));
  PDS_ASSIGN_OR_RETURN(const int32_t raw_best, scan_raw_logits(logits));

  std::span<const float> processed = logits;
  const bool has_history = !prompt_tokens.empty() || !output_tokens.empty();
  const bool penalized =
      has_history && (params.repetition_penalty != 1.0f || params.frequency_penalty != 0.0f ||
                      params.presence_penalty != 0.0f);
  if (penalized || !banned_token_ids.empty() || !params.logit_bias.empty()) {
    processed_.assign(logits.begin(), logits.end());
    // A bias never lifts a banned token: -inf stays -inf.
    for (const LogitBias& entry : params.logit_bias) processed_[entry.token] += entry.bias;
    for (int32_t token : banned_token_ids) processed_[token] = kNegInf;
    if (penalized) {
      PDS_RETURN_IF_ERROR(apply_penalties(processed_, params, prompt_tokens, output_tokens));
    }
    processed = processed_;
  }
  const int32_t best = processed.data() == logits.data() ? raw_best : argmax(processed);
  if (best < 0) return invalid_argument("every token is masked: all logits are -inf");
  return Processed{processed, best, raw_best};
}

void Sampler::select_candidates(const Processed& processed, const SamplingParams& params) {
  const std::span<const float> logits = processed.logits;
  const float max_logit = logits[processed.best];
  const float temperature = params.temperature;
  const float min_p = params.min_p;
  float threshold = kNegInf;
  if (params.top_k >= 1 && static_cast<size_t>(params.top_k) < logits.size()) {
    threshold = kth_largest(logits, static_cast<size_t>(params.top_k), selection_);
  }

  candidates_.clear();
  candidates_.reserve(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    const float logit = logits[i];
    if (logit == kNegInf || logit < threshold) continue;
    const float weight = std::exp((logit - max_logit) / temperature);
    if (weight == 0.0f || weight < min_p) continue;
    candidates_.push_back({static_cast<int32_t>(i), weight});
  }
  if (params.top_p < 1.0f) keep_top_p(params.top_p);
}

void Sampler::keep_top_p(float top_p) {
  double total = 0.0;
  for (const Candidate& candidate : candidates_) total += candidate.weight;
  const double target = static_cast<double>(top_p) * total;
  auto heavier = [](const Candidate& a, const Candidate& b) {
    return a.weight > b.weight || (a.weight == b.weight && a.token < b.token);
  };

  // Find the last token of the heaviest-first prefix without sorting the vocabulary: halve
  // the range holding it with nth_element until it is small, then sort only that. Invariant:
  // ranked_[0, low) are the heaviest candidates, their mass `before` is below the target, and
  // the prefix reaches the target at or before `high`.
  ranked_.assign(candidates_.begin(), candidates_.end());
  const auto at = [this](size_t i) { return ranked_.begin() + static_cast<std::ptrdiff_t>(i); };
  size_t low = 0;
  size_t high = ranked_.size();
  double before = 0.0;
  while (high - low > kTopPSortBelow) {
    const size_t middle = low + (high - low) / 2;
    std::nth_element(at(low), at(middle), at(high), heavier);
    double half_mass = 0.0;
    for (size_t i = low; i < middle; ++i) half_mass += ranked_[i].weight;
    if (before + half_mass >= target) {
      high = middle;
    } else {
      before += half_mass;
      low = middle;
    }
  }
  std::sort(at(low), at(high), heavier);
  size_t last = high - 1;  // if rounding keeps the sum below target, `high` bounds the prefix
  for (size_t i = low; i < high; ++i) {
    before += ranked_[i].weight;
    if (before >= target) {
      last = i;
      break;
    }
  }
  // Keep, in id order, every candidate at least as heavy as the last one of the prefix.
  const Candidate cut = ranked_[last];
  std::erase_if(candidates_, [&](const Candidate& candidate) { return heavier(cut, candidate); });
}

int32_t Sampler::draw(double unit) const {
  double total = 0.0;
  for (const Candidate& candidate : candidates_) total += candidate.weight;
  const double target = unit * total;
  double running = 0.0;
  for (const Candidate& candidate : candidates_) {
    running += candidate.weight;
    if (running > target) return candidate.token;
  }
  return candidates_.back().token;  // only when rounding made u * total reach total
}

Result<SampleResult> Sampler::finish_sample(std::span<const float> logits,
                                            const Processed& processed,
                                            const SamplingParams& params,
                                            size_t num_output_tokens, const double* unit,
                                            SamplerRng* rng) {
  SampleResult result{processed.best, 0.0f, {}};
  if (num_output_tokens < params.scripted_output.size()) {
    result.token = params.scripted_output[num_output_tokens];
  } else if (sampler_draws(params, num_output_tokens)) {
    select_candidates(processed, params);
    result.token = draw(unit != nullptr ? *unit : rng->next_unit());
  }
  if (params.want_logprobs) {
    // raw_best >= 0: had every raw logit been -inf, so would every processed one.
    const double log_normalizer = log_sum_exp(logits, logits[processed.raw_best]);
    result.logprob = static_cast<float>(static_cast<double>(logits[result.token]) - log_normalizer);
    result.top_logprobs =
        top_logprobs(logits, static_cast<size_t>(params.logprobs), log_normalizer);
  }
  return result;
}

Result<SampleResult> Sampler::sample(std::span<const float> logits, const SamplingParams& params,
                                     std::span<const int32_t> prompt_tokens,
                                     std::span<const int32_t> output_tokens, SamplerRng& rng,
                                     std::span<const int32_t> banned_token_ids) {
  PDS_ASSIGN_OR_RETURN(Processed processed, process_logits(logits, params, prompt_tokens,
                                                           output_tokens, banned_token_ids));
  return finish_sample(logits, processed, params, output_tokens.size(), nullptr, &rng);
}

Result<SampleResult> Sampler::sample_with_unit(std::span<const float> logits,
                                               const SamplingParams& params,
                                               std::span<const int32_t> prompt_tokens,
                                               std::span<const int32_t> output_tokens,
                                               double unit,
                                               std::span<const int32_t> banned_token_ids) {
  PDS_ASSIGN_OR_RETURN(Processed processed, process_logits(logits, params, prompt_tokens,
                                                           output_tokens, banned_token_ids));
  return finish_sample(logits, processed, params, output_tokens.size(), &unit, nullptr);
}

Result<SampleResult> Sampler::logprobs(std::span<const float> logits, int32_t token,
                                       int top) const {
  if (logits.empty() || token < 0 || static_cast<size_t>(token) >= logits.size()) {
    return invalid_argument("logprobs: token " + std::to_string(token) + " is outside " +
                            std::to_string(logits.size()) + " logits");
  }
  if (top < 0 || top > kMaxLogprobs) {
    return invalid_argument("logprobs: top must be in [0, " + std::to_string(kMaxLogprobs) +
                            "], got " + std::to_string(top));
  }
  PDS_ASSIGN_OR_RETURN(const int32_t best, scan_raw_logits(logits));
  if (best < 0) return invalid_argument("every token is masked: all logits are -inf");
  const double log_normalizer = log_sum_exp(logits, logits[best]);
  SampleResult result{token, 0.0f, {}};
  result.logprob = static_cast<float>(static_cast<double>(logits[token]) - log_normalizer);
  result.top_logprobs = top_logprobs(logits, static_cast<size_t>(top), log_normalizer);
  return result;
}

Result<std::vector<TokenProbability>> Sampler::distribution(
    std::span<const float> logits, const SamplingParams& params,
    std::span<const int32_t> prompt_tokens, std::span<const int32_t> output_tokens,
    std::span<const int32_t> banned_token_ids) {
  PDS_ASSIGN_OR_RETURN(Processed processed, process_logits(logits, params, prompt_tokens,
                                                           output_tokens, banned_token_ids));
  if (params.temperature < kGreedyTemperature) {
    return std::vector<TokenProbability>{{processed.best, 1.0}};
  }
  select_candidates(processed, params);
  double total = 0.0;
  for (const Candidate& candidate : candidates_) total += candidate.weight;
  std::vector<TokenProbability> result;
  result.reserve(candidates_.size());
  for (const Candidate& candidate : candidates_) {
    result.push_back({candidate.token, candidate.weight / total});
  }
  return result;
}

}  // namespace pdserve
