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
  std::vector<int32_t> short_word;
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
  // Open-addressing map from a (left id, right id) pair to its merge: one probe of a flat array
  // in the common case, which matters because encoding is mostly merge lookups.
  class MergeTable {
   public:
    void reserve(size_t count);
    // Keeps the first merge stored for a pair (the lowest rank).
    void insert(int32_t left, int32_t right, Merge merge);
    const Merge* find(int32_t left, int32_t right) const;

   private:
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    struct Slot {
      uint64_t key = kEmpty;
      Merge merge{};
    };
    size_t slot_of(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ULL) >> shift_; }
    std::vector<Slot> slots_;
    int shift_ = 64;
  };

  void merge_short_word(std::vector<int32_t>& symbols) const;
  void merge_long_word(std::string_view word, BpeScratch& scratch, std::vector<int32_t>& ids) const;

  std::vector<int32_t> byte_to_id_ = std::vector<int32_t>(256, -1);
  MergeTable merges_;
  // With ignore_merges, words that are whole tokens skip merging (keyed by raw bytes).
  std::unordered_map<std::string, int32_t> whole_words_;
};

}  // namespace pdserve::tokenizer_detail
