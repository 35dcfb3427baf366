// The proxy's view of its cluster: prefill and decode nodes, registered at start (POST
// /cluster/nodes) or listed on the command line (static), their heartbeats and load, and the
// routing choices made from them, by the costs of prefix_routing.h (the prompt's blocks each
// node holds in its pool or its KV tiers, from the prefix-cache and tiered reports in its
// heartbeats, against its load):
//  * decode: the up node of lowest cost; without prefix information, low KV usage and few
//    sequences (its reported running + waiting plus the requests this proxy has in flight
//    there) win;
//  * prefill: up nodes ordered by cost (outstanding prompt tokens this proxy sent there, less
//    the prompt's hit); the decode node tries them in that order.
// A registered node that misses heartbeats for heartbeat_timeout is dropped; a node whose
// connection fails is marked down at once (a registered node comes back with its next
// heartbeat, a static one after a cool-down). Draining nodes get no new work and leave when
// the requests this proxy sent there are done; their ids are then retired: a heartbeat from a
// retired id is refused as kFailedPrecondition (HTTP 410) so the node stops instead of
// registering again. Thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/cluster/cluster_messages.h"
#include "common/core/status.h"
#include "common/http/http_client.h"
#include "proxy/routing/cluster_advice.h"
#include "proxy/routing/prefix_routing.h"

namespace pdserve::proxy {

// A routing choice: the node's id and address, and how much of the prompt it holds.
struct NodeRef {
  std::string id;
  std::string url;
  http::BaseUrl base;
  size_t prompt_blocks = 0;  // the prompt's reusable blocks, by this node's block size
  size_t hit_blocks = 0;  // of which the node holds the leading ones in its pool (as reported)
  size_t tier_hit_blocks = 0;  // and, after or among those, the ones only in its KV tiers
  int block_size = 0;        // as the node last reported it (0: no report yet)
  int64_t queued_prompt_tokens = 0;  // prompt tokens this proxy has in flight there
};

// What routing knows of a request's prompt.
struct RoutingQuery {
  std::span<const int32_t> tokens;  // empty: unknown (no prefix scoring)
  int64_t prompt_tokens = 0;        // the prompt's length (or an estimate)
};

struct RegistryOptions {
  std::chrono::milliseconds heartbeat_timeout{3'000};
  std::chrono::milliseconds static_down_cooldown{2'000};
  RoutingWeights weights;
  size_t prefix_keys_per_node = 65'536;  // bound of each node's PrefixKeySets (pool, tiers)
};

class NodeRegistry {
 public:
  using Clock = std::chrono::steady_clock;
  // A served model name is listed by /v1/models and logged: a bound keeps one node from
  // bloating both (vLLM's and Hugging Face's names are far shorter).
  static constexpr size_t kMaxModelNameBytes = 256;

  explicit NodeRegistry(RegistryOptions options) : options_(options) {}

  // Asked for every registration that parsed, before the node is let in; an error refuses it
  // (FailedPrecondition is HTTP 409). Empty: every such registration is let in. Set it before
  // nodes register, and reset it before its target goes.
  using Admission = std::function<Status(const NodeRegistration&)>;
  void set_admission(Admission admission);

  // A node from the command line: never expires. InvalidArgument for a bad URL.
  Result<std::string> add_static(NodeRole role, const std::string& url);
  // POST /cluster/nodes body: {"role", "url", "model" (1 to kMaxModelNameBytes bytes, no
  // control character), "kv_descriptor", "kv_blocks_total" (an integer >= 0)}.
  // InvalidArgument for a malformed body or URL; AlreadyExists-like FailedPrecondition when a
  // live node already has this URL (a restarted node's stale entry, down or silent, is replaced).
  Result<std::string> register_node(const nlohmann::json& body, Clock::time_point now);
  // Body: {"load": {"num_running", "num_waiting", "kv_blocks_total", "kv_blocks_used"}, each
  // an integer >= 0 (absent: 0) and kv_blocks_used <= kv_blocks_total; "prefix_cache": a
  // PrefixCacheReport (absent: no change), "tiered_cache": the same for the node's KV
  // tiers, "draining": true when another proxy drained the
  // node (it drains here too)}. The node's state after the heartbeat (kUp or kDraining). NotFound for an unknown id (the node must register again), FailedPrecondition
  // for a retired one (it must not), InvalidArgument for a malformed or impossible load or
  // report, which leaves the node as it was (load, prefix keys and liveness).
  Result<NodeState> heartbeat(const std::string& id, const nlohmann::json& body,
                              Clock::time_point now);
  Status remove(const std::string& id);
  // Stops new work to the node; it is removed (and its id retired) once nothing this proxy
  // sent is in flight there. Static nodes too. NotFound for an unknown id.
  Status drain(const std::string& id);
  // Drops registered nodes whose heartbeats stopped, and retires drained nodes with nothing
  // in flight. Returns the ids of the silent nodes dropped (their in-flight work is lost).
  std::vector<std::string> expire(Clock::time_point now);
  void mark_down(const std::string& id, Clock::time_point now);

  // The routable decode node of lowest cost, not in `excluded`; its matched prefix keys
  // become its most recent.
  std::optional<NodeRef> pick_decode(const std::vector<std::string>& excluded,
                                     Clock::time_point now, const RoutingQuery& query = {});
  // Up prefill nodes, lowest cost first; the first one's matched keys become its most recent.
  std::vector<NodeRef> rank_prefill(Clock::time_point now, const RoutingQuery& query = {});

  // The proxy's own accounting of work it sent (released by end_request).
  void begin_request(const std::string& decode_id, const std::string& prefill_id,
                     int64_t prompt_tokens);
  void end_request(const std::string& decode_id, const std::string& prefill_id,
                   int64_t prompt_tokens);

  bool has_node(NodeRole role, Clock::time_point now);
  // Prefix keys held for all nodes (each node's at most prefix_keys_per_node).
  size_t prefix_keys();
  // The same for the nodes' KV tiers.
  size_t tiered_keys();
  // The KV descriptors of the registered decode nodes, whatever their state (a draining or
  // briefly down node still has work in flight): GET /cluster/kv-peers.
  KvPeerList decode_kv_peers();
  // The distinct model names of the routable decode nodes (static nodes name none).
  std::vector<std::string> decode_models(Clock::time_point now);
  // The routable nodes of one role, summed (GET /cluster/advice).
  PoolLoad pool_load(NodeRole role, Clock::time_point now);
  // GET /cluster.
  nlohmann::json to_json(Clock::time_point now);

 private:
  struct Node {
    std::string id;
    NodeRole role = NodeRole::kDecode;
    std::string url;
    http::BaseUrl base;
    std::string model;
    bool is_static = false;
    std::string kv_descriptor;  // as registered ("" without KV transfer)
    NodeState state = NodeState::kUp;
    Clock::time_point last_heartbeat;
    std::optional<Clock::time_point> down_until;  // static nodes after a failure
    NodeLoad load;
    int in_flight = 0;  // requests this proxy has there
    int64_t in_flight_prompt_tokens = 0;
    PrefixKeySet prefix_keys{0};
    PrefixKeySet tiered_keys{0};  // the keys in its lower KV tiers (Heartbeat::tiered_cache)
    // The block size its prompts are chained by: its reports' (0 before the first one).
    int block_size() const {
      return prefix_keys.block_size() > 0 ? prefix_keys.block_size() : tiered_keys.block_size();
    }
  };

  // The query's chain by block size, computed once per size in one routing decision.
  class Chains {
   public:
    explicit Chains(const RoutingQuery& query) : query_(query) {}
    std::span<const uint64_t> get(int block_size);

   private:
    const RoutingQuery& query_;
    std::map<int, std::vector<uint64_t>> by_block_size_;
  };

  bool routable(const Node& node, Clock::time_point now) const;
  // The matched keys of the chosen node become its most recent, in both of its key sets.
  static void touch(Node& node, std::span<const uint64_t> chain, const PrefixMatch& match);
  Node make_node() const;
  Node* find(const std::string& id);

  RegistryOptions options_;
  std::mutex mutex_;
  Admission admission_;
  std::map<std::string, Node> nodes_;
  std::set<std::string> retired_;  // drained and removed; one entry per drain, so it stays small
  uint64_t next_id_ = 1;
};

}  // namespace pdserve::proxy
