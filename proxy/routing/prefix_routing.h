// Cache-aware placement (issue #20): what the proxy knows of each node's prefix cache, and the
// cost it ranks candidates by.
//
// Nodes report the chained keys of the full KV blocks they register and drop
// (PrefixCacheReport in their heartbeats). The proxy tokenizes a prompt as the nodes do
// (prompt_tokenizer.h), chains the same keys (common/engine/block_hash.h) and counts, per node,
// how many leading blocks of the prompt the node holds: its hit, 0..1. A hit is only a hint:
// the node checks its own cache, so a stale or missing key costs a cache miss, never a wrong
// answer.
//
// A node with KV tiers (issue #32) also reports the keys it holds in host memory or on disk
// (Heartbeat::tiered_cache), kept in a second key set per node. The prompt's leading blocks the
// node holds in either are its matched prefix (match_prefix); a block in its pool counts in
// full, a block only in a tier counts w_tier (the reload is cheaper than recomputing, not free),
// so hit = (pool blocks + w_tier * tier blocks) / the prompt's reusable blocks, 0..1: a tier hit
// ranks between a pool hit of the same length and a miss.
//
// Cost of a candidate, the lowest wins (ties: the load order used before, then the node id):
//   decode:  w_kv * kv_usage + w_seq * (running + waiting + proxy in-flight) - w_prefix * hit
//   prefill: w_queue * outstanding prompt tokens / prompt tokens - w_prefix * hit
// With the default weights a full hit on a decode node is worth as much as the whole KV pool
// being free, or ten queued sequences; on a prefill node it is worth a queue of one prompt like
// this one: (outstanding + uncached tokens) / prompt tokens, the tokens to compute before this
// prompt's first token, is what the default prefill cost ranks by.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/cluster/cluster_messages.h"

namespace pdserve::proxy {

struct RoutingWeights {
  double prefix = 1.0;         // both pools: a hit of the whole prompt
  double kv = 1.0;             // decode: KV usage, 0..1
  double sequence = 0.1;       // decode: per sequence running, waiting or in flight there
  double prefill_queue = 1.0;  // prefill: per prompt-length of outstanding prompt tokens
  // Both pools: a block held only in a node's lower KV tiers, against one in its pool (1): 1 -
  // reload time / recompute time of a block. A report does not say which tier holds a key, so
  // the default is a disk reload's worth against a GPU's prefill (a host reload's is near 0.9).
  double tier_hit = 0.5;
};

struct DecodeCandidate {
  double kv_usage = 0.0;
  int sequences = 0;  // reported running + waiting, plus this proxy's requests in flight there
  double hit = 0.0;   // leading prompt blocks the node holds / the prompt's reusable blocks
};
double decode_cost(const DecodeCandidate& candidate, const RoutingWeights& weights);

struct PrefillCandidate {
  int64_t outstanding_tokens = 0;  // prompt tokens this proxy has in flight there
  double hit = 0.0;
};
// `prompt_tokens` below 1 counts as 1.
double prefill_cost(const PrefillCandidate& candidate, int64_t prompt_tokens,
                    const RoutingWeights& weights);

// Where a request's prompt is prefilled, chosen per request (conditional disaggregation, as
// Dynamo's and llm-d's): on a prefill node with its KV sent over (kRemote), on the decode node
// (kLocal: few uncached tokens, or the prefill pool's queue is long), or on the decode node
// because it holds every reusable block of the prompt (kCached: nothing to prefill but the
// last block). The proxy sends the prefill header only for kRemote.
enum class PrefillPlacement { kRemote, kLocal, kCached };
std::string_view prefill_placement_name(PrefillPlacement placement);  // "remote", "local", "cached"

struct PlacementPolicy {
  int64_t local_max_uncached_tokens = 0;  // prefill on the decode node up to this many (0: never)
  int64_t max_prefill_queue_tokens = 0;   // prefill locally above this queue (0: no limit)
};

struct PlacementInput {
  bool prompt_known = false;  // the proxy tokenized the prompt (else: kRemote, the old rule)
  bool prefill_node = false;  // a prefill node is up (else: kLocal)
  int64_t prompt_tokens = 0;
  int block_size = 0;         // the decode node's
  size_t prompt_blocks = 0;   // reusable blocks of the prompt (reusable_block_chain)
  size_t hit_blocks = 0;      // of which the decode node holds
  int64_t prefill_queue_tokens = 0;  // outstanding at the first prefill node of the ranking
};
// In this order: no prefill node -> kLocal; prompt unknown -> kRemote; every reusable block
// held -> kCached; uncached tokens (prompt - hit blocks x block size) <= the local bound ->
// kLocal; prefill queue over its bound -> kLocal; else kRemote.
PrefillPlacement choose_prefill_placement(const PlacementInput& input, const PlacementPolicy& policy);

// The chained keys of the prompt's blocks a node could reuse: every full block before the one
// holding the last token (a node always computes that token, so never reuses its block).
// Empty for block_size < 1.
std::vector<uint64_t> reusable_block_chain(std::span<const int32_t> tokens, int block_size);

class PrefixKeySet;

// The prompt's leading blocks a node holds: in its pool, or only in its lower tiers.
struct PrefixMatch {
  size_t pool_blocks = 0;
  size_t tier_blocks = 0;
  size_t blocks() const { return pool_blocks + tier_blocks; }
};
// The leading keys of `chain` held in `pool` or `tiers`, each counted where it is cheapest to
// reuse (the pool); it stops at the first held in neither, as the node's own match stops at its
// first missing block.
PrefixMatch match_prefix(std::span<const uint64_t> chain, const PrefixKeySet& pool,
                         const PrefixKeySet& tiers);
// (pool blocks + weights.tier_hit * tier blocks) / chain blocks; 0 for an empty chain.
double prefix_hit(const PrefixMatch& match, size_t chain_blocks, const RoutingWeights& weights);

// One node's prefix-cache keys as its reports left them, in least-recently-used order and at
// most `capacity` of them: a full set drops its least recent key, so a node's share of the
// proxy's memory stays bounded whatever it reports.
class PrefixKeySet {
 public:
  explicit PrefixKeySet(size_t capacity) : capacity_(capacity) {}

  // Applies a report: `reset` forgets every key first; removed keys go; stored keys become the
  // most recent. The report's block size replaces the set's.
  void apply(const PrefixCacheReport& report);
  bool contains(uint64_t key) const { return keys_.contains(key); }
  // Makes the first `count` keys of `chain` the most recent: a prefix that keeps being routed
  // here outlives ones that are not.
  void touch(std::span<const uint64_t> chain, size_t count);

  int block_size() const { return block_size_; }  // 0 until the first report
  size_t size() const { return keys_.size(); }

 private:
  void store(uint64_t key);

  size_t capacity_;
  int block_size_ = 0;
  std::list<uint64_t> recency_;  // front: most recent
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> keys_;
};

}  // namespace pdserve::proxy
