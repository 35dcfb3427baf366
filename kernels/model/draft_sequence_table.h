// The draft model's KV bookkeeping (speculative decoding, kernels/model/draft_model_proposer.h):
// which blocks of the draft's own pool each sequence holds and which tokens their KV is for.
// Simpler than the engine's BlockManager: no prefix sharing, no pins, one table per sequence.
//
// Each sequence the table knows is in one state:
//  * kHeld: it owns a block table; `tokens` have their KV in those blocks, in order.
//  * kStarved: it once needed more blocks than were free; it holds none and is not tried again
//    until a release() frees blocks (otherwise a full pool would make two sequences evict each
//    other and recompute their prompts on alternate steps).
// Unknown sequences are simply absent. release() forgets a sequence in either state.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/core/status.h"
#include "common/engine/sequence.h"

namespace pdserve {

enum class DraftSeqState { kHeld, kStarved };

class DraftSequenceTable {
 public:
  // InvalidArgument unless num_blocks >= 1 and block_size >= 1.
  static Result<DraftSequenceTable> create(int num_blocks, int block_size);

  // Prepares `seq_id` to compute `tokens` and then write KV up to `positions` positions
  // (>= tokens.size()). Its KV is rolled back to the longest common prefix of what it holds
  // and `tokens`, never covering the last token (whose logits are wanted, so it is computed
  // again), and its table grows to cover `positions`. Returns how many leading tokens already
  // have their KV, or nullopt when the pool cannot hold the sequence now: it is then starved
  // (its blocks freed). A sequence starved since the last release() is not tried again.
  std::optional<int> reserve(SeqId seq_id, std::span<const int32_t> tokens, int positions);

  // After the forwards that computed them: the reserved `tokens`, then `drafted` (tokens the
  // draft wrote after them), have their KV in the sequence's blocks. The sequence must be held
  // and still hold a prefix of `tokens` (what reserve() left); only the rest is copied.
  void set_computed(SeqId seq_id, std::span<const int32_t> tokens,
                    std::span<const int32_t> drafted);

  // Forgets the sequence and frees its blocks; unknown ids are ignored.
  void release(SeqId seq_id);

  // Empty unless the sequence is held. Valid until the next call that changes the table.
  std::span<const int32_t> block_table(SeqId seq_id) const;
  std::optional<DraftSeqState> state(SeqId seq_id) const;

  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  int num_free_blocks() const { return static_cast<int>(free_blocks_.size()); }
  int num_sequences() const { return static_cast<int>(entries_.size()); }

  // Internal error naming the first inconsistency: a block both free and held, held twice or
  // neither; a table too short for its tokens; a starved sequence holding blocks.
  Status check_invariants() const;

 private:
  struct Entry {
    DraftSeqState state = DraftSeqState::kHeld;
    std::vector<int32_t> tokens;  // with their KV in `blocks` (held only)
    std::vector<int32_t> blocks;
    uint64_t starved_at_release = 0;  // releases_ when it was starved
  };

  DraftSequenceTable(int num_blocks, int block_size);
  int blocks_for(int positions) const { return (positions + block_size_ - 1) / block_size_; }
  void shrink_to(Entry& entry, int num_tokens);
  void starve(Entry& entry);

  int num_blocks_;
  int block_size_;
  std::vector<int32_t> free_blocks_;  // taken from the back
  std::unordered_map<SeqId, Entry> entries_;
  uint64_t releases_ = 0;  // release() calls that freed blocks
};

}  // namespace pdserve
