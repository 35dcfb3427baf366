// The paged KV pool's bookkeeping: integer block ids, reference counts, one block table per
// sequence, and automatic prefix caching of full blocks.
//
// Every block is in exactly one state:
//  * used: referenced by at least one block table (refcount = number of tables holding it);
//  * cached: unreferenced but registered in the prefix index, reusable by a later sequence
//    with the same prefix until evicted (least recently freed first);
//  * free: unreferenced and holding nothing worth keeping.
//
// Prefix index. A full block whose KV has been computed is registered under the chained
// content key hash(parent key, tokens) (see block_hash.h). A hit must also match the stored
// tokens AND the exact parent block (id and generation, the generation changing whenever a
// block is handed out for new content), so even a hash function that always collides can
// never make a sequence read KV computed for a different prefix. Blocks are registered only
// once computed (cache_computed_blocks), never at allocation: a chunked prefill must not
// offer blocks whose KV is not written yet.
//
// Every key registered or dropped goes to a PrefixCacheJournal (take_prefix_cache_changes), which
// the node's heartbeats report to the proxy for cache-aware routing.
//
// Pins hold a sequence's blocks beyond free() until unpin(), e.g. while KV is being sent or
// received: a pinned block is never reused.
//
// Lower KV tiers (kv_tier_coordinator.h): with track_newly_cached on, the blocks entering the
// cached state are remembered so that hold_newly_cached can reference them under a holder table
// while their offload copy reads them: a held block is never reused until free(holder).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/core/status.h"
#include "common/engine/block_hash.h"
#include "common/engine/prefix_cache_journal.h"
#include "common/engine/sequence.h"

namespace pdserve {

struct PrefixCacheStats {
  int64_t queried_tokens = 0;  // tokens of every allocated sequence
  int64_t hit_tokens = 0;      // of which came from the cache
  double hit_rate() const {
    return queried_tokens == 0
               ? 0.0
               : static_cast<double>(hit_tokens) / static_cast<double>(queried_tokens);
  }
};

// A registered block as the lower KV tiers store it.
struct CachedBlock {
  int32_t block = 0;
  uint64_t key = 0;
  uint64_t parent_key = 0;
  std::vector<int32_t> tokens;
};

class BlockManager {
 public:
  // InvalidArgument unless num_blocks >= 1 and block_size >= 1. `hash` is replaceable so that
  // tests can force collisions.
  static Result<BlockManager> create(int num_blocks, int block_size,
                                     BlockHashFn hash = &hash_block_tokens);

  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  int block_size() const { return block_size_; }
  int blocks_for_tokens(int num_tokens) const {
    return (num_tokens + block_size_ - 1) / block_size_;
  }

  // Whether allocate(seq) would succeed now.
  bool can_allocate(const Sequence& seq) const;
  // Gives `seq` a block table covering all its tokens, reusing the cached blocks of its
  // longest cached prefix (none for a sequence that wants prompt logprobs: their logits need
  // every position computed), and sets its computed-token count to the reused length. The block
  // holding the last token is never reused: that token must be computed to get logits, and
  // computing it must not write into a block other sequences read. FailedPrecondition when
  // the sequence already holds a table (pinned tables included); ResourceExhausted when
  // can_allocate(seq) is false.
  Status allocate(Sequence& seq);

  // Whether append_slot(seq, extra) would succeed now.
  bool can_append_slot(const Sequence& seq, int extra_tokens = 0) const;
  // Grows seq's table to cover all its tokens (the decode step's new token) and
  // `extra_tokens` more (the draft tokens a speculative step verifies).
  // FailedPrecondition when seq has no table; ResourceExhausted when no block is available.
  Status append_slot(const Sequence& seq, int extra_tokens = 0);
  // Speculative decoding, after the verify step: frees the blocks of seq's table beyond those
  // its tokens need (they held only rejected drafts' KV, never registered). No-op without a
  // table.
  void release_surplus_blocks(const Sequence& seq);

  // Registers in the prefix index every full block of seq whose KV is computed
  // (seq.num_computed_tokens()). A block whose exact content is already registered stays
  // unregistered (it is freed as a plain block).
  void cache_computed_blocks(const Sequence& seq);

  // Releases seq's table (no-op when it has none); deferred until the last unpin when pinned.
  void free(SeqId seq_id);
  // Moves the table of `from` (blocks, pins, pending free) to the id `to`, e.g. so that a
  // transfer keeps holding a sequence's old blocks while the sequence gets new ones. NotFound
  // when `from` has no table; FailedPrecondition when `to` has one.
  Status hand_over(SeqId from, SeqId to);
  // NotFound when seq has no table.
  Status pin(SeqId seq_id);
  // NotFound when seq has no table; FailedPrecondition when it is not pinned.
  Status unpin(SeqId seq_id);

  // Remember the blocks that enter the cached state (for hold_newly_cached); off by default.
  void track_newly_cached(bool on);
  // Of the blocks that entered the cached state since the last call and still hold the same
  // content there, up to `max_blocks` for which `wanted(key)` holds (oldest first, those
  // evicted first): referenced by a new table `holder` (none when nothing is returned), so
  // that none is reused until free(holder). FailedPrecondition when `holder` has a table.
  Result<std::vector<CachedBlock>> hold_newly_cached(SeqId holder, int max_blocks,
                                                     const std::function<bool(uint64_t)>& wanted);

  bool has_table(SeqId seq_id) const { return tables_.contains(seq_id); }
  // Empty when seq has no table. Valid until the next call that changes this manager.
  std::span<const int32_t> block_table(SeqId seq_id) const;

  int num_free_blocks() const { return static_cast<int>(free_blocks_.size()); }
  int num_cached_blocks() const { return static_cast<int>(cached_lru_.size()); }
  int num_used_blocks() const { return num_blocks() - num_free_blocks() - num_cached_blocks(); }
  // Blocks that a new allocation may take (free, or cached and evictable).
  int num_available_blocks() const { return num_free_blocks() + num_cached_blocks(); }
  int ref_count(int32_t block) const { return blocks_.at(static_cast<size_t>(block)).ref_count; }
  const PrefixCacheStats& prefix_cache_stats() const { return stats_; }
  // The keys registered or dropped since the last call (a snapshot after the journal overflowed).
  PrefixCacheChanges take_prefix_cache_changes();
  // Every registered key: those of blocks in use, then cached ones, most recently freed first
  // (what a bounded snapshot should keep first).
  std::vector<uint64_t> registered_keys() const;

  // Internal error describing the first leak or inconsistency found: a block in more or
  // fewer than one state, a refcount different from the number of tables holding the block,
  // a block twice in one table, or a prefix index entry that does not match its block.
  Status check_invariants() const;

 private:
  struct Block {
    int ref_count = 0;
    uint64_t generation = 0;  // bumped each time the block is handed out for new content
    bool registered = false;  // in the prefix index
    uint64_t hash = 0;
    uint64_t parent_hash = 0;
    int32_t parent = -1;  // -1: first block of a sequence
    uint64_t parent_generation = 0;
    std::vector<int32_t> tokens;
    std::list<int32_t>::iterator lru_position;  // valid while cached (registered, unreferenced)
  };
  struct Table {
    std::vector<int32_t> blocks;
    std::vector<uint64_t> hashes;  // chained key of each computed full block, in order
    // The registered block standing for the last keyed block (itself, or the block already
    // registered with the same content), parent of the next block to register.
    int32_t chain_parent = -1;
    uint64_t chain_parent_generation = 0;
    int pin_count = 0;
    bool free_requested = false;  // free() came while pinned
  };
  struct PrefixMatch {
    std::vector<int32_t> blocks;
    std::vector<uint64_t> hashes;
    int num_cached_unreferenced = 0;  // hits that leave the cached state
  };

  BlockManager(int num_blocks, int block_size, BlockHashFn hash);

  PrefixMatch match_cached_prefix(std::span<const int32_t> tokens) const;
  // The cached prefix `seq` may reuse: none when it wants prompt logprobs.
  PrefixMatch reusable_prefix(const Sequence& seq) const;
  // The registered block with exactly this key, content and parent, or -1.
  int32_t find_registered(uint64_t hash, std::span<const int32_t> tokens, int32_t parent,
                          uint64_t parent_generation) const;
  int32_t take_fresh_block();
  void unregister(int32_t block);
  void release(Table& table);
  std::span<const int32_t> block_tokens(std::span<const int32_t> tokens, size_t index) const;

  int block_size_;
  BlockHashFn hash_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_blocks_;  // taken from the back
  std::list<int32_t> cached_lru_;     // front: evicted first
  std::unordered_multimap<uint64_t, int32_t> prefix_index_;
  std::unordered_map<SeqId, Table> tables_;
  PrefixCacheStats stats_;
  PrefixCacheJournal journal_{kPrefixJournalCapacity};
  bool track_newly_cached_ = false;
  std::deque<std::pair<int32_t, uint64_t>> newly_cached_;  // block, generation
};

}  // namespace pdserve
