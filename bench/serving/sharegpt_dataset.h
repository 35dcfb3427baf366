// vLLM's ShareGPT dataset, read the way `vllm bench serve --dataset-name sharegpt` reads it: a
// JSON array of {"id", "conversations": [{"from", "value"}, ...]}; each conversation with at
// least two turns gives one request, its first turn the prompt and its second turn's token count
// the output length; pairs vLLM's length filter rejects are skipped.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "bench/serving/workload.h"
#include "common/core/status.h"
#include "common/tokenizer/tokenizer.h"

namespace pdserve::bench {

// vLLM's pruning rule (is_valid_sequence): a prompt of at least 4 and at most 1024 tokens, an
// output of at least 4 tokens (not checked when the output length is fixed by a flag), and at
// most 2048 tokens together.
inline constexpr int kShareGptMinTokens = 4;
inline constexpr int kShareGptMaxPromptTokens = 1024;
inline constexpr int kShareGptMaxTotalTokens = 2048;

bool passes_vllm_length_filter(int prompt_len, int output_len, bool output_len_is_fixed);

struct ShareGptConversation {
  std::string prompt;  // the first turn's "value"
  std::string reply;   // the second turn's "value"
};

// The conversations vLLM can use, in file order. Entries without "conversations" or with fewer
// than two turns are skipped, as vLLM skips them; anything else that is not the format (not a
// JSON array, an entry that is not an object, a turn without a string "value") is
// INVALID_ARGUMENT naming `source` and the entry's index.
Result<std::vector<ShareGptConversation>> parse_sharegpt(std::string_view json_text,
                                                         const std::string& source);

// Requests as vLLM samples them: the conversations shuffled with `seed` (unless
// source.shuffle is off), each prompt and reply counted with `tokenizer` (no special tokens
// added, as Qwen's tokenizers add none), those failing the length filter skipped until
// `num_prompts` are taken, then, when fewer remain and source.oversample is on, random picks
// among them (seeded) up to `num_prompts`. Prompts are sent as text; max_tokens is the reply's
// token count or source.output_len. No usable conversation -> INVALID_ARGUMENT.
Result<std::vector<BenchRequest>> sample_sharegpt(const std::vector<ShareGptConversation>& all,
                                                  const Tokenizer& tokenizer,
                                                  const ShareGptSource& source, int num_prompts,
                                                  uint64_t seed);

// Loads source.tokenizer_path (a tokenizer.json or a directory holding one) and source.path,
// then sample_sharegpt. Arrival times are left at 0.
Result<std::vector<BenchRequest>> read_sharegpt_workload(const ShareGptSource& source,
                                                         int num_prompts, uint64_t seed);

}  // namespace pdserve::bench
