#include "common/tokenizer/bpe.h"

#include <algorithm>

namespace pdserve::tokenizer_detail {
namespace {

// Min-heap order on (rank, position): the lowest rank first, then the leftmost pair.
bool comes_later(const BpeScratch::Candidate& a, const BpeScratch::Candidate& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
}

}  // namespace

Result<BpeModel> BpeModel::build(const TokenizerSpec& spec, const ByteLevelAlphabet& alphabet) {
  BpeModel model;
  for (int byte = 0; byte < 256; ++byte) {
    const std::string& text = alphabet.encode_byte(static_cast<uint8_t>(byte));
    auto it = spec.vocab.find(text);
    if (it == spec.vocab.end()) {
      return invalid_argument("model.vocab: no token for byte " + std::to_string(byte) + " (\"" +
                              text + "\"); a byte-level vocabulary needs all 256");
    }
    model.byte_to_id_[byte] = it->second;
  }
  model.merges_.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& [left, right] = spec.merges[rank];
    const auto id_of = [&](const std::string& token) -> Result<int32_t> {
      auto it = spec.vocab.find(token);
      if (it == spec.vocab.end()) {
        return invalid_argument("model.merges[" + std::to_string(rank) + "]: \"" + token +
                                "\" is not in the vocabulary");
      }
      return it->second;
    };
    PDS_ASSIGN_OR_RETURN(const int32_t left_id, id_of(left));
    PDS_ASSIGN_OR_RETURN(const int32_t right_id, id_of(right));
    PDS_ASSIGN_OR_RETURN(const int32_t merged_id, id_of(left + right));
    // A pair listed twice keeps its first (lowest) rank.
    model.merges_.try_emplace(pair_key(left_id, right_id),
                              Merge{static_cast<uint32_t>(rank), merged_id});
  }
  if (spec.ignore_merges) {
    for (const auto& [token, id] : spec.vocab) {
      if (auto bytes = alphabet.decode_token(token))
        model.whole_words_.emplace(std::move(*bytes), id);
    }
  }
  return model;
}

const BpeModel::Merge* BpeModel::find_merge(int32_t left, int32_t right) const {
  auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::encode_word(std::string_view word, BpeScratch& scratch,
                           std::vector<int32_t>& ids) const {
  if (!whole_words_.empty()) {
    if (auto it = whole_words_.find(std::string(word)); it != whole_words_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  auto& symbols = scratch.symbols;
  auto& heap = scratch.heap;
  symbols.clear();
  heap.clear();
  const auto count = static_cast<int32_t>(word.size());
  for (int32_t i = 0; i < count; ++i) {
    symbols.push_back(
        {byte_to_id_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < count ? i + 1 : -1});
  }
  const auto push_candidate = [&](int32_t left) {
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    if (const Merge* merge = find_merge(symbols[left].id, symbols[right].id)) {
      heap.push_back({merge->rank, left, symbols[left].id, symbols[right].id, merge->merged_id});
      std::push_heap(heap.begin(), heap.end(), comes_later);
    }
  };
  for (int32_t i = 0; i + 1 < count; ++i) push_candidate(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), comes_later);
    const BpeScratch::Candidate candidate = heap.back();
    heap.pop_back();
    // Skip candidates made stale by an earlier merge of one of their symbols.
    BpeScratch::Symbol& left = symbols[candidate.left];
    if (left.id != candidate.left_id || left.next < 0) continue;
    BpeScratch::Symbol& right = symbols[left.next];
    if (right.id != candidate.right_id) continue;

    left.id = candidate.merged_id;
    right.id = -1;  // dead
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = candidate.left;
    if (left.prev >= 0) push_candidate(left.prev);
    push_candidate(candidate.left);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
}

}  // namespace pdserve::tokenizer_detail
