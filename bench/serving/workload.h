// The workload: random token-id prompts (so prompt lengths are exact) with uniformly random or
// ShareGPT-like log-normal input/output lengths, the prompts of a JSONL file, vLLM's ShareGPT
// JSON file, or multi-turn chat conversations of random words; an optional prefix shared by
// every random prompt, and Poisson or gamma arrival times.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <random>
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

// vLLM's ShareGPT dataset (--dataset-name sharegpt): the first two turns of each conversation,
// sized and filtered by token counts of a tokenizer as vLLM does (sharegpt_dataset.h).
struct ShareGptSource {
  std::string path;               // the JSON file; empty: not this dataset
  std::string tokenizer_path;     // tokenizer.json, or a model directory holding one
  std::optional<int> output_len;  // --sharegpt-output-len: replaces each reply's token count
  bool shuffle = true;            // vLLM shuffles with --seed; --disable-shuffle keeps file order
  bool oversample = true;  // repeat random picks up to --num-prompts; --no-oversample does not
};

struct WorkloadOptions {
  int num_prompts = 100;
  int input_len = 128;     // unique tokens per prompt, after the shared prefix
  int output_len = 32;     // max_tokens, with ignore_eos
  double range_ratio = 0;  // lengths uniform in [len * (1 - r), len * (1 + r)]
  int shared_prefix_len = 0;
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s
  // Shape of the gamma-distributed gaps between arrivals (mean 1 / request_rate), as vLLM's
  // --burstiness: 1 is a Poisson process, below 1 burstier, above 1 more regular.
  double burstiness = 1;
  uint64_t seed = 0;
  int vocab_size = kQwen3OrdinaryVocabSize;  // token ids are drawn from [0, vocab_size)
  LengthDistribution lengths = LengthDistribution::kUniform;
  int max_input_len = 1024;   // clip of the ShareGPT-like input lengths
  int max_output_len = 1024;  // clip of the ShareGPT-like output lengths
  // When set, the first num_prompts prompts of this JSONL file (all when it has fewer) replace
  // the random ones; its lines without "output_len" get output_len.
  std::string dataset_path;
  ShareGptSource sharegpt;
  // Multi-turn chat (--dataset-name multiturn) when > 0: num_prompts conversations of this many
  // turns, each user message input_len words (range_ratio applies), a system message of
  // shared_prefix_len words common to all conversations when > 0.
  int num_turns = 0;
};

// The words multi-turn messages are drawn from: common English words, so that the server's
// tokenizer makes ordinary tokens of them.
inline constexpr const char* kMultiTurnWords[] = {
    "the",  "of",    "and",   "to",   "in",   "is",    "you",   "that",  "it",   "he",    "was",
    "for",  "on",    "are",   "as",   "with", "his",   "they",  "at",    "be",   "this",  "have",
    "from", "or",    "one",   "had",  "by",   "word",  "but",   "not",   "what", "all",   "were",
    "we",   "when",  "your",  "can",  "said", "there", "use",   "an",    "each", "which", "she",
    "do",   "how",   "their", "if",   "will", "up",    "other", "about", "out",  "many",  "then",
    "them", "these", "so",    "some", "her",  "would", "make",  "like",  "him"};

struct BenchRequest {
  std::vector<int32_t> prompt;  // shared prefix + unique tokens; empty for a text prompt
  std::string prompt_text;      // sent as a string when set; the server tokenizes it
  int output_len = 0;
  double arrival_s = 0;  // offset from the start of the run
  // Multi-turn chat: the request's turn in its conversation, from 0. A later turn follows the
  // request before it in the workload: it is sent when that one's answer has arrived, after
  // the conversation so far (system_prompt, then each earlier user message and the answer
  // received to it).
  int turn = 0;
  std::string system_prompt;  // multi-turn: the system message when not empty
};

Status validate(const WorkloadOptions& options);

// "random", "sharegpt-synthetic", "file", "sharegpt" or "multiturn", for reports.
std::string dataset_name(const WorkloadOptions& options);

// Deterministic for a given options.seed (and file). A multi-turn workload lists each
// conversation's turns in order, conversations in arrival order; later turns carry the arrival
// time of their conversation.
Result<std::vector<BenchRequest>> make_workload(const WorkloadOptions& options);

// The gaps between arrivals as vLLM draws them: gamma with shape `burstiness` and scale
// 1 / (request_rate * burstiness), so the mean gap is 1 / request_rate; always 0 (nothing drawn)
// when the rate is infinite.
class ArrivalGaps {
 public:
  ArrivalGaps(double request_rate, double burstiness);
  double next(std::mt19937_64& rng);

 private:
  bool all_at_once_;
  bool poisson_;
  std::exponential_distribution<double> exponential_;
  std::gamma_distribution<double> gamma_;
};

// Arrival times at the gaps of ArrivalGaps, the first request at 0, drawn from a generator
// seeded with `seed`.
void assign_arrivals(std::vector<BenchRequest>& requests, double request_rate, double burstiness,
                     uint64_t seed);

}  // namespace pdserve::bench
