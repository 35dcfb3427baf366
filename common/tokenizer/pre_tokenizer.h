// Regex pre-tokenization with PCRE2: each pattern is compiled once (UTF + UCP, JIT when the
// platform has it) and shared read-only by all threads; the per-call match state lives in a
// MatchScratch that the caller owns.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/status.h"
#include "common/tokenizer/tokenizer_spec.h"

// PCRE2 types, declared here so that users of this header need not include pcre2.h.
struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_match_context_8;

namespace pdserve::tokenizer_detail {

// Match data and limits for one thread's calls; reusable across calls and splitters.
class MatchScratch {
 public:
  MatchScratch();
  pcre2_real_match_data_8* match_data() const { return match_data_.get(); }
  pcre2_real_match_context_8* context() const { return context_.get(); }

 private:
  struct MatchDataDeleter {
    void operator()(pcre2_real_match_data_8* data) const;
  };
  struct ContextDeleter {
    void operator()(pcre2_real_match_context_8* context) const;
  };
  std::unique_ptr<pcre2_real_match_data_8, MatchDataDeleter> match_data_;
  std::unique_ptr<pcre2_real_match_context_8, ContextDeleter> context_;
};

// A piece of the text being pre-tokenized, as offsets into it.
struct TextPiece {
  size_t begin = 0;
  size_t end = 0;
};

class RegexSplitter {
 public:
  // Errors name the pattern and the offset PCRE2 complains about.
  static Result<RegexSplitter> compile(const SplitSpec& spec);

  // Splits text[piece] and appends the resulting pieces to `out`. `text` must be valid UTF-8.
  // Fails only when a match runs into PCRE2's resource limits.
  Status split(std::string_view text, TextPiece piece, MatchScratch& scratch,
               std::vector<TextPiece>& out) const;

 private:
  struct CodeDeleter {
    void operator()(pcre2_real_code_8* code) const;
  };
  RegexSplitter(std::shared_ptr<pcre2_real_code_8> code, SplitBehavior behavior)
      : code_(std::move(code)), behavior_(behavior) {}

  std::shared_ptr<pcre2_real_code_8> code_;  // immutable after JIT compilation
  SplitBehavior behavior_;
};

}  // namespace pdserve::tokenizer_detail
