#include "common/engine/batch_sampler.h"

#include <string>
#include <utility>

namespace pdserve {

BatchSampler::BatchSampler(ModelExecutor& executor) : executor_(executor) {}

std::span<float> BatchSampler::logits(int num_samples) {
  logits_.resize(static_cast<size_t>(num_samples) * static_cast<size_t>(executor_.vocab_size()));
  return logits_;
}

std::span<float> BatchSampler::logits_row(size_t row) {
  const size_t vocab = static_cast<size_t>(executor_.vocab_size());
  return std::span<float>(logits_.data() + row * vocab, vocab);
}

std::vector<SlotSample> BatchSampler::sample(std::span<const SamplingSlot> slots) {
  std::vector<SlotSample> results(slots.size());
  const std::vector<Status> masked = mask_constrained_rows(slots);
  for (size_t row = 0; row < slots.size(); ++row) {
    if (slots[row].sequence == nullptr) continue;
    results[row] = masked[row].ok() ? sample_slot(slots[row], logits_row(row))
                                    : Result<SampleResult>(masked[row]);
  }
  return results;
}

std::span<const SamplingRow> BatchSampler::device_rows(std::span<const SamplingSlot> slots) {
  device_rows_.assign(slots.size(), SamplingRow{});
  for (size_t row = 0; row < slots.size(); ++row) {
    const Sequence* seq = slots[row].sequence;
    if (seq == nullptr) continue;
    SamplingRow& out = device_rows_[row];
    out.params = &seq->sampling_params();
    out.prompt_tokens = seq->prompt_tokens();
    out.output_tokens = seq->output_tokens();
    out.banned_token_ids =
        seq->stop_checker().min_tokens_banned_ids(static_cast<size_t>(seq->num_output_tokens()));
    out.rng = slots[row].rng;
  }
  return device_rows_;
}

Status BatchSampler::sample_on_device(std::span<const SamplingSlot> slots,
                                      std::vector<SlotSample>& results) {
  const size_t num_samples = slots.size();
  const size_t words = token_bitmask_words(executor_.vocab_size());
  results.assign(num_samples, std::nullopt);

  // The grammars' masks, all rows at once (ConstraintBatchMasker), while the device computes.
  std::vector<ConstraintMatcher*> matchers;
  std::vector<size_t> constrained_rows;
  for (size_t r = 0; r < num_samples; ++r) {
    if (slots[r].sequence != nullptr && slots[r].grammar != nullptr) {
      matchers.push_back(slots[r].grammar);
      constrained_rows.push_back(r);
    }
  }
  bitmasks_.assign(constrained_rows.size() * words, 0);
  std::vector<std::span<int32_t>> masks;
  std::vector<std::span<const int32_t>> allowed(num_samples);
  for (size_t i = 0; i < constrained_rows.size(); ++i) {
    masks.emplace_back(bitmasks_.data() + i * words, words);
  }
  if (!matchers.empty()) {
    const std::vector<Status> filled = grammar_masker_.allowed(matchers, masks);
    for (size_t i = 0; i < constrained_rows.size(); ++i) {
      const size_t r = constrained_rows[i];
      if (filled[i].ok()) {
        allowed[r] = masks[i];
      } else {
        // The grammar failed: its request fails; the device's token for it is ignored.
        results[r] = Result<SampleResult>(filled[i]);
      }
    }
  }

  std::vector<SampledRow> sampled_rows(num_samples);
  PDS_RETURN_IF_ERROR(
      capture_status([&] { return executor_.sample_step(allowed, sampled_rows, logits_); }));

  for (size_t r = 0; r < num_samples; ++r) {
    if (slots[r].sequence == nullptr || results[r].has_value()) continue;
    Result<SampleResult> sampled =
        device_sample_result(device_rows_[r], allowed[r], sampled_rows[r], logits_row(r));
    if (sampled.ok() && slots[r].grammar != nullptr) {
      const Status accepted = slots[r].grammar->accept(sampled->token);
      if (!accepted.ok()) sampled = accepted;
    }
    results[r] = std::move(sampled);
  }
  return Status::ok_status();
}

Result<SampleResult> BatchSampler::device_sample_result(const SamplingRow& row,
                                                        std::span<const int32_t> allowed,
                                                        const SampledRow& result,
                                                        std::span<float> logits) {
  const SamplingParams& params = *row.params;
  switch (result.outcome) {
    case SampleOutcome::kSampled:
      break;
    case SampleOutcome::kLeftToHost:
      // Nothing was drawn: the host sampler draws as it always does.
      apply_token_bitmask(allowed, logits);
      return sampler_.sample(logits, params, row.prompt_tokens, row.output_tokens, *row.rng,
                             row.banned_token_ids);
    case SampleOutcome::kInvalidLogits:
      return invalid_argument("the logits hold a NaN or +inf");
    case SampleOutcome::kAllMasked:
      return invalid_argument("every token is masked: all logits are -inf");
    case SampleOutcome::kPenaltyOverflow:
      return invalid_argument("a penalty overflowed a logit to +inf");
  }
  if (result.token < 0 || result.token >= executor_.vocab_size()) {
    return internal_error("the device sampler returned token " + std::to_string(result.token));
  }
  if (!params.want_logprobs) return SampleResult{result.token, 0.0f, {}};
  // Logprobs come from the raw logits as the host path sees them: after the grammar's mask.
  apply_token_bitmask(allowed, logits);
  return sampler_.logprobs(logits, result.token, params.logprobs);
}

std::vector<Status> BatchSampler::mask_constrained_rows(std::span<const SamplingSlot> slots) {
  std::vector<Status> statuses(slots.size(), Status::ok_status());
  std::vector<ConstraintMatcher*> matchers;
  std::vector<std::span<float>> rows;
  std::vector<size_t> row_indices;
  for (size_t row = 0; row < slots.size(); ++row) {
    if (slots[row].sequence == nullptr || slots[row].grammar == nullptr) continue;
    matchers.push_back(slots[row].grammar);
    rows.push_back(logits_row(row));
    row_indices.push_back(row);
  }
  if (matchers.empty()) return statuses;
  std::vector<Status> masked = grammar_masker_.mask(matchers, rows);
  for (size_t i = 0; i < row_indices.size(); ++i) statuses[row_indices[i]] = std::move(masked[i]);
  return statuses;
}

Result<SampleResult> BatchSampler::sample_slot(const SamplingSlot& slot,
                                               std::span<const float> logits) {
  const Sequence& seq = *slot.sequence;
  PDS_ASSIGN_OR_RETURN(
      SampleResult sampled,
      sampler_.sample(
          logits, seq.sampling_params(), seq.prompt_tokens(), seq.output_tokens(), *slot.rng,
          seq.stop_checker().min_tokens_banned_ids(static_cast<size_t>(seq.num_output_tokens()))));
  if (slot.grammar != nullptr) PDS_RETURN_IF_ERROR(slot.grammar->accept(sampled.token));
  return sampled;
}

}  // namespace pdserve
