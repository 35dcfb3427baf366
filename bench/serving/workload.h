// The workload: random token-id prompts (so prompt lengths are exact) with uniformly random or
// ShareGPT-like log-normal input/output lengths, or the prompts of a JSONL file; an optional
// prefix shared by every random prompt, and Poisson arrival times.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/core/status.h"

namespace pdserve::bench {

// Ids below this are ordinary Qwen3 vocabulary tokens (the special tokens start here).
inline constexpr int kQwen3OrdinaryVocabSize = 151643;

// Lengths of the synthetic ShareGPT-like dataset: round(exp(N(mu, sigma))) tokens, clipped to
// [1, --max-input-len] and [1, --max-output-len]. Medians about 181 input and 148 output tokens
// with long right tails, the shape of ShareGPT conversations' first turns.
inline constexpr double kShareGptInputLogMean = 5.2;
inline constexpr double kShareGptInputLogSigma = 1.1;
inline constexpr double kShareGptOutputLogMean = 5.0;
inline constexpr double kShareGptOutputLogSigma = 1.0;

enum class LengthDistribution { kUniform, kShareGptSynthetic };

struct WorkloadOptions {
  int num_prompts = 100;
  int input_len = 128;     // unique tokens per prompt, after the shared prefix
  int output_len = 32;     // max_tokens, with ignore_eos
  double range_ratio = 0;  // lengths uniform in [len * (1 - r), len * (1 + r)]
  int shared_prefix_len = 0;
  double request_rate = std::numeric_limits<double>::infinity();  // Poisson, requests/s
  uint64_t seed = 0;
  int vocab_size = kQwen3OrdinaryVocabSize;  // token ids are drawn from [0, vocab_size)
  LengthDistribution lengths = LengthDistribution::kUniform;
  int max_input_len = 1024;   // clip of the ShareGPT-like input lengths
  int max_output_len = 1024;  // clip of the ShareGPT-like output lengths
  // When set, the first num_prompts prompts of this JSONL file (all when it has fewer) replace
  // the random ones; its lines without "output_len" get output_len.
  std::string dataset_path;
};

struct BenchRequest {
  std::vector<int32_t> prompt;  // shared prefix + unique tokens; empty for a text prompt
  std::string prompt_text;      // sent as a string when set; the server tokenizes it
  int output_len = 0;
  double arrival_s = 0;  // offset from the start of the run
};

Status validate(const WorkloadOptions& options);

// "random", "sharegpt-synthetic" or "file", for reports.
std::string dataset_name(const WorkloadOptions& options);

// Deterministic for a given options.seed (and file).
Result<std::vector<BenchRequest>> make_workload(const WorkloadOptions& options);

}  // namespace pdserve::bench
