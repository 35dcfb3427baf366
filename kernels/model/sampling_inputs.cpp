#include "kernels/model/sampling_inputs.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "common/sampling/sampler.h"

namespace pdserve {
namespace {

constexpr size_t kAlignment = 16;

size_t aligned(size_t bytes) {
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

bool in_vocabulary(std::span<const int32_t> ids, int vocab_size) {
  return std::all_of(ids.begin(), ids.end(),
                     [&](int32_t id) { return id >= 0 && id < vocab_size; });
}

}  // namespace

size_t sampling_input_bytes(int max_rows, size_t list_ints) {
  return aligned(static_cast<size_t>(std::max(max_rows, 0)) * sizeof(sampling::RowArgs)) +
         list_ints * sizeof(int32_t);
}

size_t default_sampling_list_ints(int max_rows, int max_model_len) {
  // 2k entries per row, and at least two full-length contexts' worth for a batch of few.
  return std::max(size_t{2048} * static_cast<size_t>(std::max(max_rows, 1)),
                  size_t{4} * static_cast<size_t>(std::max(max_model_len, 1)));
}

bool SamplingInputPacker::append_lists(const SamplingRow& row, sampling::RowArgs& args,
                                       std::span<int32_t> lists, size_t& used) {
  const SamplingParams& params = *row.params;
  if (!in_vocabulary(row.prompt_tokens, vocab_size_) ||
      !in_vocabulary(row.output_tokens, vocab_size_) ||
      !in_vocabulary(row.banned_token_ids, vocab_size_)) {
    return false;
  }
  size_t end = used;
  const auto room = [&](size_t count) { return end + count <= lists.size(); };

  args.bias_offset = static_cast<int32_t>(end);
  args.bias_count = 0;
  for (const LogitBias& entry : params.logit_bias) {
    if (entry.token < 0 || entry.token >= vocab_size_ || !room(2)) return false;
    lists[end++] = entry.token;
    uint32_t bits;
    std::memcpy(&bits, &entry.bias, sizeof(bits));
    lists[end++] = static_cast<int32_t>(bits);
    ++args.bias_count;
  }
  args.banned_offset = static_cast<int32_t>(end);
  args.banned_count = 0;
  if (!room(row.banned_token_ids.size())) return false;
  for (int32_t token : row.banned_token_ids) {
    lists[end++] = token;
    ++args.banned_count;
  }

  // The host sampler penalizes only with a history and a penalty that changes something.
  const bool has_history = !row.prompt_tokens.empty() || !row.output_tokens.empty();
  args.repetition_offset = static_cast<int32_t>(end);
  args.repetition_count = 0;
  args.frequency_offset = static_cast<int32_t>(end);
  args.frequency_count = 0;
  if (!has_history) {
    used = end;
    return true;
  }
  const size_t vocab = static_cast<size_t>(vocab_size_);
  if (params.repetition_penalty != 1.0f) {
    if (seen_.size() < vocab) seen_.resize(vocab, 0);
    bool fits = true;
    const auto collect = [&](std::span<const int32_t> ids) {
      for (int32_t token : ids) {
        if (seen_[static_cast<size_t>(token)]) continue;
        seen_[static_cast<size_t>(token)] = 1;
        if (!room(1)) {
          fits = false;
          continue;  // keep marking, so the clearing below finds every mark
        }
        lists[end++] = token;
        ++args.repetition_count;
      }
    };
    collect(row.prompt_tokens);
    collect(row.output_tokens);
    for (int32_t token : row.prompt_tokens) seen_[static_cast<size_t>(token)] = 0;
    for (int32_t token : row.output_tokens) seen_[static_cast<size_t>(token)] = 0;
    if (!fits) return false;
  }
  args.frequency_offset = static_cast<int32_t>(end);
  if (params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f) {
    if (counts_.size() < vocab) counts_.resize(vocab, 0);
    for (int32_t token : row.output_tokens) ++counts_[static_cast<size_t>(token)];
    bool fits = true;
    for (int32_t token : row.output_tokens) {
      int32_t& count = counts_[static_cast<size_t>(token)];
      if (count == 0) continue;  // listed already
      if (room(2)) {
        lists[end++] = token;
        lists[end++] = count;
        ++args.frequency_count;
      } else {
        fits = false;
      }
      count = 0;
    }
    if (!fits) return false;
  }
  used = end;
  return true;
}

Result<PackedSampling> SamplingInputPacker::pack(std::span<const SamplingRow> rows,
                                                 std::span<const int32_t> logits_rows,
                                                 std::span<std::byte> area,
                                                 std::span<SampleOutcome> outcomes) {
  if (logits_rows.size() != rows.size() || outcomes.size() != rows.size()) {
    return invalid_argument("sampling inputs: " + std::to_string(rows.size()) + " rows, " +
                            std::to_string(logits_rows.size()) + " logits rows, " +
                            std::to_string(outcomes.size()) + " outcomes");
  }
  PackedSampling packed;
  packed.num_rows = static_cast<int>(rows.size());
  packed.lists_offset = aligned(rows.size() * sizeof(sampling::RowArgs));
  if (packed.lists_offset > area.size() ||
      reinterpret_cast<uintptr_t>(area.data()) % alignof(sampling::RowArgs) != 0) {
    return invalid_argument("sampling inputs: " + std::to_string(rows.size()) +
                            " rows do not fit " + std::to_string(area.size()) + " bytes");
  }
  auto* args_out = reinterpret_cast<sampling::RowArgs*>(area.data());
  const std::span<int32_t> lists(reinterpret_cast<int32_t*>(area.data() + packed.lists_offset),
                                 (area.size() - packed.lists_offset) / sizeof(int32_t));
  size_t used = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const SamplingRow& row = rows[i];
    sampling::RowArgs args;
    args.logits_row = logits_rows[i];
    outcomes[i] = SampleOutcome::kSampled;
    if (row.params == nullptr) {
      args.flags = sampling::kRowSkip;
      args_out[i] = args;
      continue;
    }
    const SamplingParams& params = *row.params;
    const size_t num_output = row.output_tokens.size();
    const bool draws = sampler_draws(params, num_output);
    if (draws && row.rng == nullptr) {
      return invalid_argument("sampling inputs: row " + std::to_string(i) +
                              " draws but has no generator");
    }
    const size_t before = used;
    const bool device_can =
        append_lists(row, args, lists, used) &&
        !(draws && params.top_p < 1.0f && vocab_size_ > sampling::kMaxTopPVocab);
    if (!device_can) {
      used = before;  // nothing of the row stays
      args.flags = sampling::kRowSkip;
      outcomes[i] = SampleOutcome::kLeftToHost;
      args_out[i] = args;
      continue;
    }
    args.temperature = params.temperature;
    args.top_p = params.top_p;
    args.top_k = params.top_k >= 1 && params.top_k < vocab_size_ ? params.top_k : 0;
    args.min_p = params.min_p;
    args.repetition = params.repetition_penalty;
    args.frequency = params.frequency_penalty;
    args.presence = params.presence_penalty;
    if (num_output < params.scripted_output.size()) {
      args.flags |= sampling::kRowForced;
      args.forced_token = params.scripted_output[num_output];
    } else if (!draws) {
      args.flags |= sampling::kRowGreedy;
    } else {
      args.unit = row.rng->next_unit();
    }
    args_out[i] = args;
  }
  packed.bytes = packed.lists_offset + used * sizeof(int32_t);
  return packed;
}

}  // namespace pdserve
