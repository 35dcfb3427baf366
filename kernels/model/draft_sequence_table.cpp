#include "kernels/model/draft_sequence_table.h"

#include <algorithm>
#include <string>

namespace pdserve {

Result<DraftSequenceTable> DraftSequenceTable::create(int num_blocks, int block_size) {
  if (num_blocks < 1 || block_size < 1) {
    return invalid_argument("draft KV pool: num_blocks (" + std::to_string(num_blocks) +
                            ") and block_size (" + std::to_string(block_size) +
                            ") must be at least 1");
  }
  return DraftSequenceTable(num_blocks, block_size);
}

DraftSequenceTable::DraftSequenceTable(int num_blocks, int block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  free_blocks_.reserve(static_cast<size_t>(num_blocks));
  for (int32_t block = num_blocks - 1; block >= 0; --block) free_blocks_.push_back(block);
}

void DraftSequenceTable::shrink_to(Entry& entry, int num_tokens) {
  entry.tokens.resize(static_cast<size_t>(num_tokens));
  const size_t keep = static_cast<size_t>(blocks_for(num_tokens));
  while (entry.blocks.size() > keep) {
    free_blocks_.push_back(entry.blocks.back());
    entry.blocks.pop_back();
  }
}

void DraftSequenceTable::starve(Entry& entry) {
  shrink_to(entry, 0);
  entry.state = DraftSeqState::kStarved;
  entry.starved_at_release = releases_;
}

std::optional<int> DraftSequenceTable::reserve(SeqId seq_id, std::span<const int32_t> tokens,
                                               int positions) {
  PDS_CHECK(!tokens.empty() && positions >= static_cast<int>(tokens.size()),
            "DraftSequenceTable::reserve: no tokens, or positions short of them");
  auto [it, inserted] = entries_.try_emplace(seq_id);
  Entry& entry = it->second;
  if (!inserted && entry.state == DraftSeqState::kStarved) {
    if (entry.starved_at_release == releases_) return std::nullopt;
    entry.state = DraftSeqState::kHeld;
  }
  // The longest common prefix, short of the last token.
  const size_t limit = std::min(entry.tokens.size(), tokens.size() - 1);
  const size_t common = static_cast<size_t>(
      std::mismatch(entry.tokens.begin(), entry.tokens.begin() + static_cast<ptrdiff_t>(limit),
                    tokens.begin())
          .first -
      entry.tokens.begin());
  shrink_to(entry, static_cast<int>(common));
  const size_t needed = static_cast<size_t>(blocks_for(positions));
  if (needed - entry.blocks.size() > free_blocks_.size()) {
    starve(entry);
    return std::nullopt;
  }
  while (entry.blocks.size() < needed) {
    entry.blocks.push_back(free_blocks_.back());
    free_blocks_.pop_back();
  }
  return static_cast<int>(common);
}

void DraftSequenceTable::set_computed(SeqId seq_id, std::span<const int32_t> tokens,
                                      std::span<const int32_t> drafted) {
  const auto it = entries_.find(seq_id);
  PDS_CHECK(it != entries_.end() && it->second.state == DraftSeqState::kHeld,
            "DraftSequenceTable::set_computed: the sequence is not held");
  Entry& entry = it->second;
  PDS_CHECK(entry.tokens.size() <= tokens.size() &&
                blocks_for(static_cast<int>(tokens.size() + drafted.size())) <=
                    static_cast<int>(entry.blocks.size()),
            "DraftSequenceTable::set_computed: not what was reserved");
  entry.tokens.insert(entry.tokens.end(),
                      tokens.begin() + static_cast<ptrdiff_t>(entry.tokens.size()), tokens.end());
  entry.tokens.insert(entry.tokens.end(), drafted.begin(), drafted.end());
}

void DraftSequenceTable::release(SeqId seq_id) {
  const auto it = entries_.find(seq_id);
  if (it == entries_.end()) return;
  if (!it->second.blocks.empty()) ++releases_;
  shrink_to(it->second, 0);
  entries_.erase(it);
}

std::span<const int32_t> DraftSequenceTable::block_table(SeqId seq_id) const {
  const auto it = entries_.find(seq_id);
  if (it == entries_.end()) return {};
  return it->second.blocks;
}

std::optional<DraftSeqState> DraftSequenceTable::state(SeqId seq_id) const {
  const auto it = entries_.find(seq_id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.state;
}

Status DraftSequenceTable::check_invariants() const {
  std::vector<int> owners(static_cast<size_t>(num_blocks_), 0);
  for (const int32_t block : free_blocks_) {
    if (block < 0 || block >= num_blocks_) {
      return internal_error("draft pool: free block " + std::to_string(block) + " out of range");
    }
    ++owners[static_cast<size_t>(block)];
  }
  for (const auto& [seq_id, entry] : entries_) {
    const std::string name = "draft pool: sequence " + std::to_string(seq_id);
    if (entry.state == DraftSeqState::kStarved && !entry.blocks.empty()) {
      return internal_error(name + " is starved but holds blocks");
    }
    if (blocks_for(static_cast<int>(entry.tokens.size())) > static_cast<int>(entry.blocks.size())) {
      return internal_error(name + " has more tokens than its blocks hold");
    }
    for (const int32_t block : entry.blocks) {
      if (block < 0 || block >= num_blocks_) {
        return internal_error(name + " holds block " + std::to_string(block) + " out of range");
      }
      ++owners[static_cast<size_t>(block)];
    }
  }
  for (int block = 0; block < num_blocks_; ++block) {
    if (owners[static_cast<size_t>(block)] != 1) {
      return internal_error("draft pool: block " + std::to_string(block) + " is free or held " +
                            std::to_string(owners[static_cast<size_t>(block)]) +
                            " times (once expected)");
    }
  }
  return Status::ok_status();
}

}  // namespace pdserve
