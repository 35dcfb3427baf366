// The synthetic workload: random token-id prompts (so prompt lengths are exact), uniformly
// random input/output lengths, an optional prefix shared by every prompt, and arrival times.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "common/core/status.h"

namespace pdserve::bench {

// Ids below this are ordinary Qwen3 vocabulary tokens (the special tokens start here).
inline constexpr int kQwen3OrdinaryVocabSize = 151643;

struct WorkloadOptions {
  int num_prompts = 100;
  int input_len = 128;     // unique tokens per prompt, after the shared prefix
  int output_len = 32;     // max_tokens, with ignore_eos
  double range_ratio = 0;  // lengths uniform in [len * (1 - r), len * (1 + r)]
  int shared_prefix_len = 0;
  double request_rate = std::numeric_limits<double>::infinity();  // Poisson, requests/s
  uint64_t seed = 0;
  int vocab_size = kQwen3OrdinaryVocabSize;  // token ids are drawn from [0, vocab_size)
};

struct BenchRequest {
  std::vector<int32_t> prompt;  // shared prefix + unique tokens
  int output_len = 0;
  double arrival_s = 0;  // offset from the start of the run
};

Status validate(const WorkloadOptions& options);

// Deterministic for a given options.seed.
Result<std::vector<BenchRequest>> make_workload(const WorkloadOptions& options);

}  // namespace pdserve::bench
