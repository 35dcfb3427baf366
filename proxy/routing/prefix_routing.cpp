#include "proxy/routing/prefix_routing.h"

#include <algorithm>

#include "common/engine/block_hash.h"

namespace pdserve::proxy {

double decode_cost(const DecodeCandidate& candidate, const RoutingWeights& weights) {
  return weights.kv * candidate.kv_usage + weights.sequence * candidate.sequences -
         weights.prefix * candidate.hit;
}

double prefill_cost(const PrefillCandidate& candidate, int64_t prompt_tokens,
                    const RoutingWeights& weights) {
  const double prompt = static_cast<double>(std::max<int64_t>(prompt_tokens, 1));
  return weights.prefill_queue * static_cast<double>(candidate.outstanding_tokens) / prompt -
         weights.prefix * candidate.hit;
}

std::string_view prefill_placement_name(PrefillPlacement placement) {
  switch (placement) {
    case PrefillPlacement::kRemote:
      return "remote";
    case PrefillPlacement::kLocal:
      return "local";
    case PrefillPlacement::kCached:
      return "cached";
  }
  return "remote";
}

PrefillPlacement choose_prefill_placement(const PlacementInput& input,
                                          const PlacementPolicy& policy) {
  if (!input.prefill_node) return PrefillPlacement::kLocal;
  if (!input.prompt_known) return PrefillPlacement::kRemote;
  if (input.prompt_blocks > 0 && input.hit_blocks >= input.prompt_blocks) {
    return PrefillPlacement::kCached;
  }
  const int64_t cached = static_cast<int64_t>(input.hit_blocks) * input.block_size;
  const int64_t uncached = std::max<int64_t>(0, input.prompt_tokens - cached);
  if (uncached <= policy.local_max_uncached_tokens) return PrefillPlacement::kLocal;
  if (policy.max_prefill_queue_tokens > 0 &&
      input.prefill_queue_tokens > policy.max_prefill_queue_tokens) {
    return PrefillPlacement::kLocal;
  }
  return PrefillPlacement::kRemote;
}

std::vector<uint64_t> reusable_block_chain(std::span<const int32_t> tokens, int block_size) {
  std::vector<uint64_t> chain;
  if (block_size < 1 || tokens.empty()) return chain;
  const size_t block = static_cast<size_t>(block_size);
  const size_t reusable = (tokens.size() - 1) / block;
  chain.reserve(reusable);
  uint64_t parent = kRootBlockHash;
  for (size_t index = 0; index < reusable; ++index) {
    parent = hash_block_tokens(parent, tokens.subspan(index * block, block));
    chain.push_back(parent);
  }
  return chain;
}

PrefixMatch match_prefix(std::span<const uint64_t> chain, const PrefixKeySet& pool,
                         const PrefixKeySet& tiers) {
  PrefixMatch match;
  for (const uint64_t key : chain) {
    if (pool.contains(key)) {
      ++match.pool_blocks;
    } else if (tiers.contains(key)) {
      ++match.tier_blocks;
    } else {
      break;
    }
  }
  return match;
}

double prefix_hit(const PrefixMatch& match, size_t chain_blocks, const RoutingWeights& weights) {
  if (chain_blocks == 0) return 0.0;
  return (static_cast<double>(match.pool_blocks) +
          weights.tier_hit * static_cast<double>(match.tier_blocks)) /
         static_cast<double>(chain_blocks);
}

void PrefixKeySet::store(uint64_t key) {
  if (auto it = keys_.find(key); it != keys_.end()) {
    recency_.splice(recency_.begin(), recency_, it->second);
    return;
  }
  if (capacity_ == 0) return;
  if (keys_.size() == capacity_) {
    keys_.erase(recency_.back());
    recency_.pop_back();
  }
  recency_.push_front(key);
  keys_.emplace(key, recency_.begin());
}

void PrefixKeySet::apply(const PrefixCacheReport& report) {
  block_size_ = report.block_size;
  if (report.reset) {
    keys_.clear();
    recency_.clear();
  }
  for (uint64_t key : report.removed) {
    if (auto it = keys_.find(key); it != keys_.end()) {
      recency_.erase(it->second);
      keys_.erase(it);
    }
  }
  for (uint64_t key : report.stored) store(key);
}

void PrefixKeySet::touch(std::span<const uint64_t> chain, size_t count) {
  // The chain's root last, so that it is the most recent: a node's blocks are only reachable
  // through their parents.
  for (size_t index = std::min(count, chain.size()); index-- > 0;) {
    if (auto it = keys_.find(chain[index]); it != keys_.end()) {
      recency_.splice(recency_.begin(), recency_, it->second);
    }
  }
}

}  // namespace pdserve::proxy
