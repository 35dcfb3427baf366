// The proxy's routing entry point: where one attempt of a request goes. The proxy server asks
// it for the prompt's ids (cache-aware routing tokenizes prompts as the nodes do,
// prompt_tokenizer.h, with the cluster's tokenizer: cluster_tokenizer.h) and then, per attempt, for
// a placement: the decode node of lowest cost (node_registry.h, costs of prefix_routing.h) and
// where the prompt is prefilled (a prefill node, ranked, or the decode node itself). It counts what
// it chose in the proxy's metrics (placements, prefix hits, tokenizing time). Thread-safe, as the
// registry is.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/metrics/metrics.h"
#include "proxy/routing/cluster_advice.h"
#include "proxy/routing/cluster_tokenizer.h"
#include "proxy/routing/node_registry.h"
#include "proxy/routing/prefix_routing.h"
#include "proxy/routing/prompt_tokenizer.h"

namespace pdserve::proxy {

// One attempt's choice.
struct RequestPlacement {
  NodeRef decode;
  PrefillPlacement placement = PrefillPlacement::kRemote;
  // kRemote: the up prefill nodes, lowest cost first (the decode node tries them in this
  // order); empty otherwise.
  std::vector<NodeRef> prefill;
  std::string prefill_id;  // the first of them, or empty
};

class RequestPlacer {
 public:
  using Clock = std::chrono::steady_clock;

  // `registry` and `metrics` must outlive the placer. While it lives, the registry asks it
  // about each registering node (its tokenizer). Until a tokenizer is known, requests are
  // placed by load alone. Every series it counts is in `metrics` at zero from the start.
  RequestPlacer(NodeRegistry& registry, ClusterTokenizerOptions tokenizer,
                std::string cluster_token, PlacementPolicy policy, metrics::Registry& metrics);
  ~RequestPlacer();
  RequestPlacer(const RequestPlacer&) = delete;
  RequestPlacer& operator=(const RequestPlacer&) = delete;

  const ClusterTokenizer& tokenizer() const { return tokenizer_; }

  // The prompt's leading ids for cache-aware routing, or nullopt (no tokenizer yet or at all,
  // or a body the tokenizer does not take: the request is then placed by load alone).
  std::optional<PromptTokens> tokenize(PromptKind kind, std::string_view body);

  // The routable decode node of lowest cost not in `excluded`, and where the prompt is
  // prefilled; nullopt when no decode node is left.
  std::optional<RequestPlacement> place(const RoutingQuery& query,
                                        const std::vector<std::string>& excluded,
                                        Clock::time_point now);

 private:
  void count_prefix_hits(NodeRole pool, const NodeRef& node);

  NodeRegistry& registry_;
  ClusterTokenizer tokenizer_;
  PlacementPolicy policy_;
  metrics::Registry& metrics_;
  metrics::Histogram& tokenize_time_;
};

}  // namespace pdserve::proxy
