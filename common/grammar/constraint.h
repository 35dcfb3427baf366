// Structured outputs: a StructuredOutput (common/sampling/sampling_params.h) compiled against a
// model's vocabulary, and the per-sequence matcher that, before each sampling step, sets every
// logit the grammar forbids to -inf. The engine is xgrammar's C++ core (scripts/setup.sh
// fetches it); its types stay inside this module.
//
// A token is allowed when its bytes continue the grammar; special tokens and ids the tokenizer
// does not know never are; the stop tokens (EOS) only once the grammar is complete. JSON is
// compact (", " and ": " separators, no other whitespace), so every bounded schema finishes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/core/status.h"
#include "common/sampling/sampling_params.h"
#include "common/tokenizer/tokenizer.h"

namespace pdserve {

// A grammar compiled for one vocabulary; shared by the sequences that use it. Opaque.
class CompiledConstraint;
using ConstraintHandle = std::shared_ptr<const CompiledConstraint>;

// Parses `output` into a grammar without a vocabulary (cheap next to compiling it):
// InvalidArgument, naming the problem, when the schema, regex or grammar is malformed or uses
// what xgrammar does not support. Thread-safe.
Status check_structured_output(const StructuredOutput& output);

// The grammar whose sentences are exactly `choices` (vLLM's guided_choice).
StructuredOutput choice_output(std::span<const std::string> choices);

class ConstraintCompiler {
 public:
  // `vocab_size`: the rows of the model's logits (at least the tokenizer's vocabulary).
  ConstraintCompiler(Tokenizer tokenizer, int vocab_size, std::vector<int32_t> stop_token_ids);
  ~ConstraintCompiler();
  ConstraintCompiler(const ConstraintCompiler&) = delete;
  ConstraintCompiler& operator=(const ConstraintCompiler&) = delete;

  // Thread-safe. Each distinct output is compiled once and cached (xgrammar's compiler cache);
  // the vocabulary's tables are built on the first call. InvalidArgument as
  // check_structured_output.
  Result<ConstraintHandle> compile(const StructuredOutput& output) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class ConstraintMatcher;

// Sets logits[t] = -inf for every token t whose bit (bit t % 32 of word t / 32) is clear.
void apply_token_bitmask(std::span<const int32_t> bitmask, std::span<float> logits);

// Words of a token bitmask over `vocab_size` tokens (ceil(vocab_size / 32)).
inline size_t token_bitmask_words(int vocab_size) {
  return (static_cast<size_t>(vocab_size) + 31) / 32;
}

// Masks the logits of a batch's constrained sequences in one call: their allowed-token sets
// are computed in parallel on xgrammar's batch matcher (one thread per hardware thread: the
// model's workers are idle while a step samples), so a batch of them costs about one
// sequence's time on a host with the cores.
class ConstraintBatchMasker {
 public:
  ConstraintBatchMasker();
  ~ConstraintBatchMasker();
  ConstraintBatchMasker(const ConstraintBatchMasker&) = delete;
  ConstraintBatchMasker& operator=(const ConstraintBatchMasker&) = delete;

  // For each i, what matchers[i]->mask(logits[i]) does; one status per matcher. The matchers
  // must be distinct.
  std::vector<Status> mask(std::span<ConstraintMatcher* const> matchers,
                           std::span<const std::span<float>> logits);
  // For each i, what matchers[i]->allowed() computes, into bitmasks[i] (token_bitmask_words of
  // the vocabulary each): for a sampler that applies the masks itself (on its device).
  std::vector<Status> allowed(std::span<ConstraintMatcher* const> matchers,
                              std::span<const std::span<int32_t>> bitmasks);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The grammar state of one sequence. Not thread-safe; movable.
class ConstraintMatcher {
 public:
  explicit ConstraintMatcher(ConstraintHandle constraint);
  ~ConstraintMatcher();
  ConstraintMatcher(ConstraintMatcher&&) noexcept;
  ConstraintMatcher& operator=(ConstraintMatcher&&) noexcept;

  // Sets logits[t] = -inf for every token t the grammar does not allow next. `logits` has the
  // compiler's vocab_size entries. FailedPrecondition once a stop token was accepted.
  Status mask(std::span<float> logits);
  // The allowed tokens as a bitmask (bit t % 32 of word t / 32), as mask() computes it.
  Status allowed(std::vector<int32_t>& bitmask);
  // Advances over `token`; InvalidArgument when the grammar does not allow it (the state is
  // then unchanged).
  Status accept(int32_t token);
  // The output so far is a complete sentence of the grammar (a stop token may come next).
  bool complete() const;

 private:
  friend class ConstraintBatchMasker;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdserve
