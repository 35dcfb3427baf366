// Byte-level BPE: a word's bytes start as one symbol each and the adjacent pair with the lowest
// merge rank is merged until no pair has a merge (ties go to the leftmost pair, as in HF).
// Symbols are token ids throughout, so no strings are built while encoding.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/core/status.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/tokenizer_spec.h"

namespace pdserve::tokenizer_detail {

// Reusable buffers for encode_word, one per calling thread.
struct BpeScratch {
  struct Symbol {
    int32_t id;
    int32_t prev;  // index of the previous live symbol, -1 at the start
    int32_t next;  // index of the next live symbol, -1 at the end
  };
  struct Candidate {
    uint32_t rank;
    int32_t left;  // index of the left symbol
    int32_t left_id;
    int32_t right_id;
    int32_t merged_id;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

class BpeModel {
 public:
  // Checks that every byte has a token and that every merge joins two tokens into a third.
  static Result<BpeModel> build(const TokenizerSpec& spec, const ByteLevelAlphabet& alphabet);

  // Appends the ids of the raw-byte word `word` (non-empty) to `ids`.
  void encode_word(std::string_view word, BpeScratch& scratch, std::vector<int32_t>& ids) const;

 private:
  struct Merge {
    uint32_t rank;
    int32_t merged_id;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  const Merge* find_merge(int32_t left, int32_t right) const;

  std::vector<int32_t> byte_to_id_ = std::vector<int32_t>(256, -1);
  std::unordered_map<uint64_t, Merge> merges_;
  // With ignore_merges, words that are whole tokens skip merging (keyed by raw bytes).
  std::unordered_map<std::string, int32_t> whole_words_;
};

}  // namespace pdserve::tokenizer_detail
