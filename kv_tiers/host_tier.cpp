#include "kv_tiers/host_tier.h"

#include <utility>

namespace pdserve::kv_tiers {

HostTier::HostTier(kv_transfer::StagingMemory memory, int num_slots, uint64_t block_bytes)
    : memory_(std::move(memory)),
      block_bytes_(block_bytes),
      slots_(static_cast<size_t>(num_slots)) {
  free_.reserve(static_cast<size_t>(num_slots));
  for (int slot = num_slots - 1; slot >= 0; --slot) free_.push_back(slot);
}

std::optional<int> HostTier::find(uint64_t key) const {
  auto it = index_.find(key);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

std::optional<int> HostTier::reserve(TieredBlockId id) {
  if (free_.empty()) return std::nullopt;
  const int index = free_.back();
  free_.pop_back();
  Slot& entry = slot(index);
  index_[id.key] = index;
  entry.id = std::move(id);
  entry.state = SlotState::kLanding;
  entry.readers = 0;
  return index;
}

void HostTier::seal(int index, uint64_t checksum) {
  Slot& entry = slot(index);
  entry.checksum = checksum;
  entry.state = SlotState::kReady;
  entry.lru_position = lru_.insert(lru_.end(), index);
}

void HostTier::touch(int index) {
  Slot& entry = slot(index);
  if (entry.state == SlotState::kReady) lru_.splice(lru_.end(), lru_, entry.lru_position);
}

std::optional<int> HostTier::lru_victim() const {
  for (int index : lru_) {
    if (slots_[static_cast<size_t>(index)].readers == 0) return index;
  }
  return std::nullopt;
}

void HostTier::start_spill(int index) {
  Slot& entry = slot(index);
  lru_.erase(entry.lru_position);
  entry.state = SlotState::kSpilling;
  ++num_spilling_;
}

void HostTier::doom(int index) {
  Slot& entry = slot(index);
  if (entry.state == SlotState::kReady) lru_.erase(entry.lru_position);
  if (entry.state == SlotState::kSpilling) --num_spilling_;
  auto it = index_.find(entry.id.key);
  if (it != index_.end() && it->second == index) index_.erase(it);
  entry.state = SlotState::kDoomed;
}

void HostTier::release(int index) {
  Slot& entry = slot(index);
  if (entry.state == SlotState::kReady) lru_.erase(entry.lru_position);
  if (entry.state == SlotState::kSpilling) --num_spilling_;
  auto it = index_.find(entry.id.key);
  if (it != index_.end() && it->second == index) index_.erase(it);
  entry = Slot{};
  free_.push_back(index);
}

std::vector<uint64_t> HostTier::keys() const {
  std::vector<uint64_t> keys;
  keys.reserve(lru_.size());
  for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
    keys.push_back(slots_[static_cast<size_t>(*it)].id.key);
  }
  return keys;
}

}  // namespace pdserve::kv_tiers
