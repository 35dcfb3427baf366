// The host half of the device sampler: turns a step's SamplingRows (common/engine/
// model_executor.h) into the arguments the CUDA sampling kernel reads (kernels/sampling_rows.h)
// and draws each row's u from its request's generator exactly when the host sampler would
// (sampler_draws). Penalties travel as lists of distinct ids (the repetition penalty's set of
// prompt and output ids, the output ids with their counts), built here as the host sampler
// builds them, so each logit is edited by one thread. Host-only and device-independent: tested
// on the CPU against common/sampling/sampler.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/core/status.h"
#include "common/engine/model_executor.h"
#include "kernels/sampling_rows.h"

namespace pdserve {

// Where a step's sampling inputs lie in their area: RowArgs[num_rows] at its start, then the
// int32 list area at lists_offset.
struct PackedSampling {
  int num_rows = 0;
  size_t lists_offset = 0;
  size_t bytes = 0;  // used of the area
};

// Bytes of sampling inputs for up to `max_rows` rows and `list_ints` list entries.
size_t sampling_input_bytes(int max_rows, size_t list_ints);
// The list entries a device sampler reserves: enough for every row's grammar-free lists in
// common use (logit_bias, EOS bans, the penalties' id sets of a few thousand tokens); a row
// whose lists do not fit is left to the host sampler.
size_t default_sampling_list_ints(int max_rows, int max_model_len);

class SamplingInputPacker {
 public:
  explicit SamplingInputPacker(int vocab_size) : vocab_size_(vocab_size) {}

  // Writes one RowArgs per row (row i samples logits row logits_rows[i]) and their lists into
  // `area` (16-byte aligned), drawing u for the rows that draw. outcomes[i] becomes
  // kLeftToHost, with nothing drawn, for a row the device cannot take: its lists do not fit
  // what is left of `area`, an id lies outside the vocabulary (the host sampler then names
  // it), or top_p < 1 over a vocabulary above kMaxTopPVocab; kSampled otherwise. A row with
  // params == nullptr is skipped (kRowSkip, kSampled). InvalidArgument when `area` cannot hold
  // the row arguments or the spans' sizes differ.
  Result<PackedSampling> pack(std::span<const SamplingRow> rows,
                              std::span<const int32_t> logits_rows, std::span<std::byte> area,
                              std::span<SampleOutcome> outcomes);

 private:
  // Appends the row's lists at `lists[used...]`; false (nothing kept) when they do not fit or
  // an id is out of range.
  bool append_lists(const SamplingRow& row, sampling::RowArgs& args, std::span<int32_t> lists,
                    size_t& used);

  int vocab_size_;
  std::vector<uint8_t> seen_;    // per token, while collecting a distinct set (left all zero)
  std::vector<int32_t> counts_;  // per token, while counting output ids (left all zero)
};

}  // namespace pdserve
