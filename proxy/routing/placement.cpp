#include "proxy/routing/placement.h"

#include <utility>

namespace pdserve::proxy {
namespace {

// The proxy's own work per request: fine buckets from 10 us.
const std::vector<double> kFastBuckets = {0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005,
                                          0.001,   0.0025,   0.005,   0.01,   0.025};

metrics::Counter& placement_counter(metrics::Registry& metrics, PrefillPlacement placement) {
  return metrics.counter("pdserve:proxy_prefill_placements_total",
                         "Where requests' prompts were prefilled: remote (a prefill node), local "
                         "(the decode node), cached (the decode node held every reusable block).",
                         {{"placement", std::string(prefill_placement_name(placement))}});
}

metrics::Counter& prefix_query_counter(metrics::Registry& metrics, NodeRole pool) {
  return metrics.counter("pdserve:proxy_prefix_query_blocks_total",
                         "Reusable prompt blocks looked up in the proxy's prefix index, by pool.",
                         {{"pool", std::string(node_role_name(pool))}});
}

metrics::Counter& prefix_hit_counter(metrics::Registry& metrics, NodeRole pool) {
  return metrics.counter("pdserve:proxy_prefix_hit_blocks_total",
                         "Of those, the leading blocks the chosen node held, by pool.",
                         {{"pool", std::string(node_role_name(pool))}});
}

metrics::Counter& prefix_tier_hit_counter(metrics::Registry& metrics, NodeRole pool) {
  return metrics.counter("pdserve:proxy_prefix_tier_hit_blocks_total",
                         "Of those, the blocks the chosen node held only in its KV tiers (host "
                         "memory, disk), by pool.",
                         {{"pool", std::string(node_role_name(pool))}});
}

}  // namespace

RequestPlacer::RequestPlacer(NodeRegistry& registry, ClusterTokenizerOptions tokenizer,
                             std::string cluster_token, PlacementPolicy policy,
                             metrics::Registry& metrics)
    : registry_(registry),
      tokenizer_(std::move(tokenizer), std::move(cluster_token), metrics),
      policy_(policy),
      metrics_(metrics),
      tokenize_time_(metrics.histogram(
          "pdserve:proxy_prompt_tokenize_seconds",
          "Parsing, templating and tokenizing a prompt for cache-aware routing.", kFastBuckets)) {
  for (const PrefillPlacement placement :
       {PrefillPlacement::kRemote, PrefillPlacement::kLocal, PrefillPlacement::kCached}) {
    placement_counter(metrics_, placement);
  }
  for (const NodeRole pool : {NodeRole::kDecode, NodeRole::kPrefill}) {
    prefix_query_counter(metrics_, pool);
    prefix_hit_counter(metrics_, pool);
    prefix_tier_hit_counter(metrics_, pool);
  }
  registry_.set_admission(
      [this](const NodeRegistration& registration) { return tokenizer_.admit(registration); });
}

RequestPlacer::~RequestPlacer() {
  registry_.set_admission({});
}

std::optional<PromptTokens> RequestPlacer::tokenize(PromptKind kind, std::string_view body) {
  const std::shared_ptr<const PromptTokenizer> tokenizer = tokenizer_.current();
  if (!tokenizer) return std::nullopt;
  const Clock::time_point start = Clock::now();
  std::optional<PromptTokens> tokens = tokenizer->tokens(kind, body);
  tokenize_time_.observe(std::chrono::duration<double>(Clock::now() - start).count());
  return tokens;
}

std::optional<RequestPlacement> RequestPlacer::place(const RoutingQuery& query,
                                                     const std::vector<std::string>& excluded,
                                                     Clock::time_point now) {
  std::optional<NodeRef> decode = registry_.pick_decode(excluded, now, query);
  if (!decode) return std::nullopt;
  RequestPlacement placed;
  placed.decode = std::move(*decode);
  std::vector<NodeRef> prefill = registry_.rank_prefill(now, query);
  PlacementInput input;
  input.prompt_known = !query.tokens.empty();
  input.prefill_node = !prefill.empty();
  input.prompt_tokens = query.prompt_tokens;
  input.block_size = placed.decode.block_size;
  input.prompt_blocks = placed.decode.prompt_blocks;
  input.hit_blocks = placed.decode.hit_blocks;
  input.prefill_queue_tokens = prefill.empty() ? 0 : prefill.front().queued_prompt_tokens;
  placed.placement = choose_prefill_placement(input, policy_);
  const bool remote = placed.placement == PrefillPlacement::kRemote;
  placement_counter(metrics_, placed.placement).inc();
  if (input.prompt_known) {
    count_prefix_hits(NodeRole::kDecode, placed.decode);
    if (remote) count_prefix_hits(NodeRole::kPrefill, prefill.front());
  }
  if (remote) {
    placed.prefill_id = prefill.front().id;
    placed.prefill = std::move(prefill);
  }
  return placed;
}

void RequestPlacer::count_prefix_hits(NodeRole pool, const NodeRef& node) {
  prefix_query_counter(metrics_, pool).inc(static_cast<double>(node.prompt_blocks));
  prefix_hit_counter(metrics_, pool).inc(static_cast<double>(node.hit_blocks));
  prefix_tier_hit_counter(metrics_, pool).inc(static_cast<double>(node.tier_hit_blocks));
}

}  // namespace pdserve::proxy
