#include "common/tokenizer/bpe.h"

#include <algorithm>

namespace pdserve::tokenizer_detail {
namespace {

// Min-heap order on (rank, position): the lowest rank first, then the leftmost pair.
// (A function object rather than a function so that the heap operations inline it.)
struct ComesLater {
  bool operator()(const BpeScratch::Candidate& a, const BpeScratch::Candidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  }
};

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Words up to this many bytes are merged by rescanning the pair ranks (cheap for a handful of
// symbols); longer ones use a heap so that hostile inputs stay O(n log n).
constexpr size_t kShortWordBytes = 128;

}  // namespace

void BpeModel::MergeTable::reserve(size_t count) {
  size_t capacity = 16;
  shift_ = 60;
  while (capacity < count * 2) {
    capacity *= 2;
    --shift_;
  }
  slots_.assign(capacity, Slot{});
}

void BpeModel::MergeTable::insert(int32_t left, int32_t right, Merge merge) {
  const uint64_t key = pair_key(left, right);
  const size_t mask = slots_.size() - 1;
  for (size_t i = slot_of(key);; i = (i + 1) & mask) {
    if (slots_[i].key == key) return;
    if (slots_[i].key == kEmpty) {
      slots_[i] = {key, merge};
      return;
    }
  }
}

const BpeModel::Merge* BpeModel::MergeTable::find(int32_t left, int32_t right) const {
  const uint64_t key = pair_key(left, right);
  const size_t mask = slots_.size() - 1;
  for (size_t i = slot_of(key);; i = (i + 1) & mask) {
    if (slots_[i].key == key) return &slots_[i].merge;
    if (slots_[i].key == kEmpty) return nullptr;
  }
}

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
    model.merges_.insert(left_id, right_id, Merge{static_cast<uint32_t>(rank), merged_id});
  }
  if (spec.ignore_merges) {
    for (const auto& [token, id] : spec.vocab) {
      if (auto bytes = alphabet.decode_token(token))
        model.whole_words_.emplace(std::move(*bytes), id);
    }
  }
  return model;
}

void BpeModel::encode_word(std::string_view word, BpeScratch& scratch,
                           std::vector<int32_t>& ids) const {
  if (!whole_words_.empty()) {
    if (auto it = whole_words_.find(std::string(word)); it != whole_words_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  if (word.size() > kShortWordBytes) {
    merge_long_word(word, scratch, ids);
    return;
  }
  std::vector<int32_t>& symbols = scratch.short_word;
  symbols.clear();
  for (char byte : word) symbols.push_back(byte_to_id_[static_cast<uint8_t>(byte)]);
  merge_short_word(symbols);
  ids.insert(ids.end(), symbols.begin(), symbols.end());
}

void BpeModel::merge_short_word(std::vector<int32_t>& symbols) const {
  // ranks[i]: rank of the merge of symbols[i] and symbols[i + 1], or kNone.
  constexpr uint32_t kNone = ~uint32_t{0};
  uint32_t ranks[kShortWordBytes];
  int32_t merged[kShortWordBytes];
  const auto rank_pair = [&](size_t i) {
    const Merge* merge = merges_.find(symbols[i], symbols[i + 1]);
    ranks[i] = merge != nullptr ? merge->rank : kNone;
    merged[i] = merge != nullptr ? merge->merged_id : -1;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) rank_pair(i);
  while (symbols.size() > 1) {
    size_t best = 0;  // the leftmost pair of lowest rank
    for (size_t i = 1; i + 1 < symbols.size(); ++i) {
      if (ranks[i] < ranks[best]) best = i;
    }
    if (ranks[best] == kNone) break;
    symbols[best] = merged[best];
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    for (size_t i = best + 1; i + 1 < symbols.size(); ++i) {  // pairs right of the merge shift left
      ranks[i] = ranks[i + 1];
      merged[i] = merged[i + 1];
    }
    if (best > 0) rank_pair(best - 1);
    if (best + 1 < symbols.size()) rank_pair(best);
  }
}

void BpeModel::merge_long_word(std::string_view word, BpeScratch& scratch,
                               std::vector<int32_t>& ids) const {
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
    if (const Merge* merge = merges_.find(symbols[left].id, symbols[right].id)) {
      heap.push_back({merge->rank, left, symbols[left].id, symbols[right].id, merge->merged_id});
      std::push_heap(heap.begin(), heap.end(), ComesLater{});
    }
  };
  for (int32_t i = 0; i + 1 < count; ++i) push_candidate(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), ComesLater{});
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
