// The host tier's slots: one allocation (page-locked on CUDA: PoolCopier::allocate_staging) cut
// into block-sized slots, each holding one block as [layer 0 K][layer 0 V][layer 1 K]... A slot
// is free, landing (an offload copy is writing it), ready (holds a sealed block: checksummed,
// in the LRU, a hit), or spilling (being written to the disk tier). A ready slot read by a
// reload (readers > 0) is never evicted; one found corrupt is doomed: no longer a hit, freed
// when its last reader leaves. Not thread-safe: the store serializes it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

#include "common/engine/kv_tier.h"
#include "kv_transfer/pool_copier.h"

namespace pdserve::kv_tiers {

class HostTier {
 public:
  enum class SlotState { kFree, kLanding, kReady, kSpilling, kDoomed };
  struct Slot {
    SlotState state = SlotState::kFree;
    TieredBlockId id;
    uint64_t checksum = 0;
    int readers = 0;
    std::list<int>::iterator lru_position;  // valid while ready
  };

  HostTier(kv_transfer::StagingMemory memory, int num_slots, uint64_t block_bytes);

  int num_slots() const { return static_cast<int>(slots_.size()); }
  int num_free() const { return static_cast<int>(free_.size()); }
  int num_held() const { return num_slots() - num_free(); }
  int num_spilling() const { return num_spilling_; }
  int num_ready() const { return static_cast<int>(lru_.size()); }
  uint64_t block_bytes() const { return block_bytes_; }
  std::byte* data(int slot) { return memory_.get() + static_cast<uint64_t>(slot) * block_bytes_; }
  Slot& slot(int index) { return slots_.at(static_cast<size_t>(index)); }

  // The slot holding `key` in any state; nullopt when none.
  std::optional<int> find(uint64_t key) const;
  // A free slot for `id`, now landing; nullopt when none is free.
  std::optional<int> reserve(TieredBlockId id);
  // The landed slot's block is checksummed: ready, most recently used.
  void seal(int slot, uint64_t checksum);
  void touch(int slot);
  // The least recently used ready slot without readers; nullopt when none.
  std::optional<int> lru_victim() const;
  void start_spill(int slot);
  // A corrupt block: no longer a hit; the caller releases it once it has no readers.
  void doom(int slot);
  // Frees the slot (its key leaves the index).
  void release(int slot);
  // Ready slots' keys, most recently used first.
  std::vector<uint64_t> keys() const;

 private:
  kv_transfer::StagingMemory memory_;
  uint64_t block_bytes_;
  std::vector<Slot> slots_;
  std::vector<int> free_;
  std::list<int> lru_;  // ready slots; front: evicted first
  std::unordered_map<uint64_t, int> index_;
  int num_spilling_ = 0;
};

}  // namespace pdserve::kv_tiers
