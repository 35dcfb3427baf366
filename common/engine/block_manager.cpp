#include "common/engine/block_manager.h"

#include <algorithm>
#include <string>

namespace pdserve {
namespace {

std::string seq_name(SeqId seq_id) {
  return "sequence " + std::to_string(seq_id);
}
std::string block_name(int32_t block) {
  return "block " + std::to_string(block);
}

}  // namespace

Result<BlockManager> BlockManager::create(int num_blocks, int block_size, BlockHashFn hash) {
  if (num_blocks < 1) {
    return invalid_argument("block manager: num_blocks must be >= 1, got " +
                            std::to_string(num_blocks));
  }
  if (block_size < 1) {
    return invalid_argument("block manager: block_size must be >= 1, got " +
                            std::to_string(block_size));
  }
  if (hash == nullptr) return invalid_argument("block manager: null hash function");
  return BlockManager(num_blocks, block_size, hash);
}

BlockManager::BlockManager(int num_blocks, int block_size, BlockHashFn hash)
    : block_size_(block_size), hash_(hash), blocks_(static_cast<size_t>(num_blocks)) {
  // Taken from the back: hand out low ids first, which keeps tests readable.
  free_blocks_.reserve(static_cast<size_t>(num_blocks));
  for (int32_t block = num_blocks - 1; block >= 0; --block) free_blocks_.push_back(block);
}

std::span<const int32_t> BlockManager::block_tokens(std::span<const int32_t> tokens,
                                                    size_t index) const {
  const size_t begin = index * static_cast<size_t>(block_size_);
  return tokens.subspan(begin, std::min(tokens.size() - begin, static_cast<size_t>(block_size_)));
}

int32_t BlockManager::find_registered(uint64_t hash, std::span<const int32_t> tokens,
                                      int32_t parent, uint64_t parent_generation) const {
  auto [begin, end] = prefix_index_.equal_range(hash);
  for (auto it = begin; it != end; ++it) {
    const Block& block = blocks_[static_cast<size_t>(it->second)];
    if (block.parent == parent && block.parent_generation == parent_generation &&
        std::ranges::equal(block.tokens, tokens)) {
      return it->second;
    }
  }
  return -1;
}

BlockManager::PrefixMatch BlockManager::match_cached_prefix(std::span<const int32_t> tokens) const {
  PrefixMatch match;
  // Only blocks that lie entirely before the last token may be reused (see allocate()).
  const size_t max_blocks = (tokens.size() - 1) / static_cast<size_t>(block_size_);
  uint64_t parent_hash = kRootBlockHash;
  int32_t parent = -1;
  uint64_t parent_generation = 0;
  for (size_t index = 0; index < max_blocks; ++index) {
    const std::span<const int32_t> content = block_tokens(tokens, index);
    const uint64_t hash = hash_(parent_hash, content);
    const int32_t hit = find_registered(hash, content, parent, parent_generation);
    if (hit < 0) break;
    const Block& block = blocks_[static_cast<size_t>(hit)];
    if (block.ref_count == 0) ++match.num_cached_unreferenced;
    match.blocks.push_back(hit);
    match.hashes.push_back(hash);
    parent_hash = hash;
    parent = hit;
    parent_generation = block.generation;
  }
  return match;
}

BlockManager::PrefixMatch BlockManager::reusable_prefix(const Sequence& seq) const {
  // Prompt logprobs need the logits of every prompt position, so all of them are computed
  // (vLLM skips the prefix cache for these requests too).
  if (seq.sampling_params().prompt_logprobs) return {};
  return match_cached_prefix(seq.tokens());
}

bool BlockManager::can_allocate(const Sequence& seq) const {
  if (tables_.contains(seq.id())) return false;
  const PrefixMatch match = reusable_prefix(seq);
  const int fresh = blocks_for_tokens(seq.num_tokens()) - static_cast<int>(match.blocks.size());
  return fresh <= num_available_blocks() - match.num_cached_unreferenced;
}

Status BlockManager::allocate(Sequence& seq) {
  if (tables_.contains(seq.id())) {
    return failed_precondition(seq_name(seq.id()) + " already holds a block table");
  }
  PrefixMatch match = reusable_prefix(seq);
  const int fresh = blocks_for_tokens(seq.num_tokens()) - static_cast<int>(match.blocks.size());
  if (fresh > num_available_blocks() - match.num_cached_unreferenced) {
    return resource_exhausted(seq_name(seq.id()) + " needs " + std::to_string(fresh) +
                              " new KV blocks, " + std::to_string(num_available_blocks()) +
                              " available");
  }
  for (int32_t hit : match.blocks) {
    Block& block = blocks_[static_cast<size_t>(hit)];
    if (block.ref_count++ == 0) cached_lru_.erase(block.lru_position);
  }
  Table table;
  if (!match.blocks.empty()) {
    table.chain_parent = match.blocks.back();
    table.chain_parent_generation = blocks_[static_cast<size_t>(table.chain_parent)].generation;
  }
  table.blocks = std::move(match.blocks);
  table.hashes = std::move(match.hashes);
  for (int i = 0; i < fresh; ++i) table.blocks.push_back(take_fresh_block());

  const int hit_tokens = static_cast<int>(table.hashes.size()) * block_size_;
  stats_.queried_tokens += seq.num_tokens();
  stats_.hit_tokens += hit_tokens;
  seq.set_num_computed_tokens(hit_tokens);
  tables_.emplace(seq.id(), std::move(table));
  return Status::ok_status();
}

bool BlockManager::can_append_slot(const Sequence& seq, int extra_tokens) const {
  auto it = tables_.find(seq.id());
  if (it == tables_.end()) return false;
  const int needed = blocks_for_tokens(seq.num_tokens() + extra_tokens) -
                     static_cast<int>(it->second.blocks.size());
  return needed <= num_available_blocks();
}

Status BlockManager::append_slot(const Sequence& seq, int extra_tokens) {
  auto it = tables_.find(seq.id());
  if (it == tables_.end()) return failed_precondition(seq_name(seq.id()) + " has no blocks");
  if (!can_append_slot(seq, extra_tokens)) {
    return resource_exhausted(seq_name(seq.id()) + ": no KV block available to grow into");
  }
  std::vector<int32_t>& blocks = it->second.blocks;
  while (static_cast<int>(blocks.size()) < blocks_for_tokens(seq.num_tokens() + extra_tokens)) {
    blocks.push_back(take_fresh_block());
  }
  return Status::ok_status();
}

void BlockManager::release_surplus_blocks(const Sequence& seq) {
  auto it = tables_.find(seq.id());
  if (it == tables_.end()) return;
  std::vector<int32_t>& blocks = it->second.blocks;
  while (static_cast<int>(blocks.size()) > blocks_for_tokens(seq.num_tokens())) {
    const int32_t id = blocks.back();
    Block& block = blocks_[static_cast<size_t>(id)];
    // Beyond the computed tokens, so never registered; taken fresh, so held by this table only.
    PDS_CHECK(block.ref_count == 1 && !block.registered,
              "releasing a surplus " + block_name(id) + " that is shared or registered");
    block.ref_count = 0;
    free_blocks_.push_back(id);
    blocks.pop_back();
  }
}

int32_t BlockManager::take_fresh_block() {
  int32_t id;
  if (!free_blocks_.empty()) {
    id = free_blocks_.back();
    free_blocks_.pop_back();
  } else {
    PDS_CHECK(!cached_lru_.empty(), "take_fresh_block without an available block");
    id = cached_lru_.front();
    cached_lru_.pop_front();
    unregister(id);
  }
  Block& block = blocks_[static_cast<size_t>(id)];
  ++block.generation;
  block.ref_count = 1;
  return id;
}

void BlockManager::unregister(int32_t id) {
  Block& block = blocks_[static_cast<size_t>(id)];
  auto [begin, end] = prefix_index_.equal_range(block.hash);
  for (auto it = begin; it != end; ++it) {
    if (it->second == id) {
      prefix_index_.erase(it);
      break;
    }
  }
  // A colliding block registered under the same key keeps it alive.
  if (!prefix_index_.contains(block.hash)) journal_.record_removed(block.hash);
  block.registered = false;
  block.tokens.clear();
  block.parent = -1;
}

void BlockManager::cache_computed_blocks(const Sequence& seq) {
  auto it = tables_.find(seq.id());
  if (it == tables_.end()) return;
  Table& table = it->second;
  const size_t num_full =
      std::min(static_cast<size_t>(seq.num_computed_tokens() / block_size_), table.blocks.size());
  const std::span<const int32_t> tokens = seq.tokens();
  for (size_t index = table.hashes.size(); index < num_full; ++index) {
    const std::span<const int32_t> content = block_tokens(tokens, index);
    const uint64_t parent_hash = index == 0 ? kRootBlockHash : table.hashes[index - 1];
    const uint64_t hash = hash_(parent_hash, content);
    table.hashes.push_back(hash);
    const int32_t id = table.blocks[index];
    const int32_t duplicate =
        find_registered(hash, content, table.chain_parent, table.chain_parent_generation);
    // A block computed alongside an identical one stays unregistered; its successors chain
    // onto the registered twin so that they stay reachable.
    const int32_t representative = duplicate >= 0 ? duplicate : id;
    if (duplicate < 0) {
      Block& block = blocks_[static_cast<size_t>(id)];
      block.registered = true;
      block.hash = hash;
      block.parent_hash = parent_hash;
      block.parent = table.chain_parent;
      block.parent_generation = table.chain_parent_generation;
      block.tokens.assign(content.begin(), content.end());
      prefix_index_.emplace(hash, id);
      journal_.record_stored(hash);
    }
    table.chain_parent = representative;
    table.chain_parent_generation = blocks_[static_cast<size_t>(representative)].generation;
  }
}

PrefixCacheChanges BlockManager::take_prefix_cache_changes() {
  if (journal_.needs_snapshot()) journal_.set_snapshot(registered_keys());
  return journal_.take();
}

std::vector<uint64_t> BlockManager::registered_keys() const {
  std::vector<uint64_t> keys;
  keys.reserve(prefix_index_.size());
  for (const Block& block : blocks_) {
    if (block.registered && block.ref_count > 0) keys.push_back(block.hash);
  }
  for (auto it = cached_lru_.rbegin(); it != cached_lru_.rend(); ++it) {
    keys.push_back(blocks_[static_cast<size_t>(*it)].hash);
  }
  return keys;
}

void BlockManager::release(Table& table) {
  // Tail blocks first, so that the sequence's last blocks (least likely to be shared) are
  // evicted before its prefix.
  for (auto it = table.blocks.rbegin(); it != table.blocks.rend(); ++it) {
    Block& block = blocks_[static_cast<size_t>(*it)];
    PDS_CHECK(block.ref_count > 0, "releasing an unreferenced " + block_name(*it));
    if (--block.ref_count > 0) continue;
    if (block.registered) {
      block.lru_position = cached_lru_.insert(cached_lru_.end(), *it);
      if (track_newly_cached_) {
        if (newly_cached_.size() >= blocks_.size()) newly_cached_.pop_front();
        newly_cached_.emplace_back(*it, block.generation);
      }
    } else {
      free_blocks_.push_back(*it);
    }
  }
  table.blocks.clear();
}

void BlockManager::free(SeqId seq_id) {
  auto it = tables_.find(seq_id);
  if (it == tables_.end()) return;
  if (it->second.pin_count > 0) {
    it->second.free_requested = true;
    return;
  }
  release(it->second);
  tables_.erase(it);
}

void BlockManager::track_newly_cached(bool on) {
  track_newly_cached_ = on;
  if (!on) newly_cached_.clear();
}

Result<std::vector<CachedBlock>> BlockManager::hold_newly_cached(
    SeqId holder, int max_blocks, const std::function<bool(uint64_t)>& wanted) {
  if (tables_.contains(holder)) {
    return failed_precondition(seq_name(holder) + " already holds blocks");
  }
  std::vector<CachedBlock> held;
  Table table;
  while (!newly_cached_.empty() && static_cast<int>(held.size()) < max_blocks) {
    const auto [id, generation] = newly_cached_.front();
    newly_cached_.pop_front();
    Block& block = blocks_[static_cast<size_t>(id)];
    // Reused, evicted or already held since it entered the cached state: skip it.
    if (block.ref_count != 0 || !block.registered || block.generation != generation) continue;
    if (!wanted(block.hash)) continue;
    cached_lru_.erase(block.lru_position);
    block.ref_count = 1;
    table.blocks.push_back(id);
    held.push_back({id, block.hash, block.parent_hash, block.tokens});
  }
  if (!held.empty()) tables_.emplace(holder, std::move(table));
  return held;
}

Status BlockManager::hand_over(SeqId from, SeqId to) {
  auto it = tables_.find(from);
  if (it == tables_.end()) return not_found(seq_name(from) + " has no blocks to hand over");
  if (tables_.contains(to)) {
    return failed_precondition(seq_name(to) + " already holds blocks");
  }
  auto node = tables_.extract(it);
  node.key() = to;
  tables_.insert(std::move(node));
  return Status::ok_status();
}

Status BlockManager::pin(SeqId seq_id) {
  auto it = tables_.find(seq_id);
  if (it == tables_.end()) return not_found(seq_name(seq_id) + " has no blocks to pin");
  ++it->second.pin_count;
  return Status::ok_status();
}

Status BlockManager::unpin(SeqId seq_id) {
  auto it = tables_.find(seq_id);
  if (it == tables_.end()) return not_found(seq_name(seq_id) + " has no blocks to unpin");
  if (it->second.pin_count == 0) return failed_precondition(seq_name(seq_id) + " is not pinned");
  if (--it->second.pin_count == 0 && it->second.free_requested) {
    release(it->second);
    tables_.erase(it);
  }
  return Status::ok_status();
}

std::span<const int32_t> BlockManager::block_table(SeqId seq_id) const {
  auto it = tables_.find(seq_id);
  if (it == tables_.end()) return {};
  return it->second.blocks;
}

Status BlockManager::check_invariants() const {
  const size_t n = blocks_.size();
  std::vector<int> holders(n, 0);
  for (const auto& [seq_id, table] : tables_) {
    std::vector<bool> seen(n, false);
    for (int32_t id : table.blocks) {
      if (id < 0 || static_cast<size_t>(id) >= n) {
        return internal_error(seq_name(seq_id) + " holds invalid " + block_name(id));
      }
      if (seen[static_cast<size_t>(id)]) {
        return internal_error(seq_name(seq_id) + " holds " + block_name(id) + " twice");
      }
      seen[static_cast<size_t>(id)] = true;
      ++holders[static_cast<size_t>(id)];
    }
    if (table.hashes.size() > table.blocks.size()) {
      return internal_error(seq_name(seq_id) + " has more block keys than blocks");
    }
    for (size_t i = 0; i < table.hashes.size(); ++i) {
      const Block& block = blocks_[static_cast<size_t>(table.blocks[i])];
      if (block.registered && block.hash != table.hashes[i]) {
        return internal_error(seq_name(seq_id) + ": key of " + block_name(table.blocks[i]) +
                              " differs from the one it is registered under");
      }
    }
    if (table.free_requested && table.pin_count == 0) {
      return internal_error(seq_name(seq_id) + " was freed but its blocks were kept unpinned");
    }
  }

  std::vector<int> in_free(n, 0);
  std::vector<int> in_lru(n, 0);
  for (int32_t id : free_blocks_) ++in_free[static_cast<size_t>(id)];
  for (int32_t id : cached_lru_) ++in_lru[static_cast<size_t>(id)];
  size_t num_registered = 0;
  for (size_t i = 0; i < n; ++i) {
    const Block& block = blocks_[i];
    const int32_t id = static_cast<int32_t>(i);
    if (block.ref_count != holders[i]) {
      return internal_error(block_name(id) + " has refcount " + std::to_string(block.ref_count) +
                            " but " + std::to_string(holders[i]) + " tables hold it");
    }
    const int states = (block.ref_count > 0 ? 1 : 0) + in_free[i] + in_lru[i];
    if (states != 1) {
      return internal_error(block_name(id) + " is in " + std::to_string(states) +
                            " states (used/free/cached) instead of one");
    }
    if (in_lru[i] == 1 && !block.registered) {
      return internal_error(block_name(id) + " is cached but not in the prefix index");
    }
    if (in_lru[i] == 1 && *block.lru_position != id) {
      return internal_error(block_name(id) + " has a stale LRU position");
    }
    if (in_free[i] == 1 && block.registered) {
      return internal_error(block_name(id) + " is free but still in the prefix index");
    }
    if (!block.registered) continue;
    ++num_registered;
    if (block.tokens.size() != static_cast<size_t>(block_size_) ||
        hash_(block.parent_hash, block.tokens) != block.hash) {
      return internal_error(block_name(id) + " does not match its prefix key");
    }
    auto [begin, end] = prefix_index_.equal_range(block.hash);
    if (std::count_if(begin, end, [id](const auto& entry) { return entry.second == id; }) != 1) {
      return internal_error(block_name(id) + " is not indexed exactly once under its key");
    }
  }
  if (num_registered != prefix_index_.size()) {
    return internal_error("prefix index has " + std::to_string(prefix_index_.size()) +
                          " entries for " + std::to_string(num_registered) + " registered blocks");
  }
  return Status::ok_status();
}

}  // namespace pdserve
