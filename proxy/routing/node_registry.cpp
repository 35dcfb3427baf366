#include "proxy/routing/node_registry.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>

namespace pdserve::proxy {

using Json = nlohmann::json;

namespace {

Status check_model_name(std::string_view model) {
  if (model.empty()) return invalid_argument("registration: 'model' must name the served model");
  if (model.size() > NodeRegistry::kMaxModelNameBytes) {
    return invalid_argument("registration: 'model' is longer than " +
                            std::to_string(NodeRegistry::kMaxModelNameBytes) + " bytes");
  }
  if (std::ranges::any_of(model,
                          [](char c) { return std::iscntrl(static_cast<unsigned char>(c)); })) {
    return invalid_argument("registration: 'model' holds a control character");
  }
  return Status::ok_status();
}

}  // namespace

NodeRegistry::Node NodeRegistry::make_node() const {
  Node node;
  node.prefix_keys = PrefixKeySet(options_.prefix_keys_per_node);
  node.tiered_keys = PrefixKeySet(options_.prefix_keys_per_node);
  return node;
}

std::span<const uint64_t> NodeRegistry::Chains::get(int block_size) {
  auto [it, added] = by_block_size_.try_emplace(block_size);
  if (added) it->second = reusable_block_chain(query_.tokens, block_size);
  return it->second;
}

NodeRegistry::Node* NodeRegistry::find(const std::string& id) {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : &it->second;
}

Result<std::string> NodeRegistry::add_static(NodeRole role, const std::string& url) {
  PDS_ASSIGN_OR_RETURN(http::BaseUrl base, http::parse_base_url(url));
  std::lock_guard lock(mutex_);
  Node node = make_node();
  node.id = std::string(node_role_name(role)) + "-" + std::to_string(next_id_++);
  node.role = role;
  node.url = base.to_string();
  node.base = std::move(base);
  node.is_static = true;
  node.last_heartbeat = Clock::now();
  const std::string id = node.id;
  nodes_.emplace(id, std::move(node));
  return id;
}

void NodeRegistry::set_admission(Admission admission) {
  std::lock_guard lock(mutex_);
  admission_ = std::move(admission);
}

Result<std::string> NodeRegistry::register_node(const Json& body, Clock::time_point now) {
  PDS_ASSIGN_OR_RETURN(NodeRegistration registration, NodeRegistration::parse(body));
  PDS_RETURN_IF_ERROR(check_model_name(registration.model));
  PDS_ASSIGN_OR_RETURN(http::BaseUrl base, http::parse_base_url(registration.url));
  std::lock_guard lock(mutex_);
  const std::string url = registration.url;
  auto stale = nodes_.end();
  for (auto it = nodes_.begin(); it != nodes_.end(); ++it) {
    if (it->second.url != url) continue;
    const bool live = it->second.state != NodeState::kDown &&
                      now - it->second.last_heartbeat < options_.heartbeat_timeout;
    if (live && !it->second.is_static) {
      return failed_precondition("registration: node " + it->first + " is already live at " + url);
    }
    stale = it;
    break;
  }
  if (admission_) PDS_RETURN_IF_ERROR(admission_(registration));
  // A restarted node's stale entry (or a static entry it now owns).
  if (stale != nodes_.end()) nodes_.erase(stale);
  Node node = make_node();
  node.id = std::string(node_role_name(registration.role)) + "-" + std::to_string(next_id_++);
  node.role = registration.role;
  node.url = url;
  node.base = std::move(base);
  node.model = std::move(registration.model);
  node.kv_descriptor = std::move(registration.kv_descriptor);
  node.last_heartbeat = now;
  node.load.kv_blocks_total = registration.kv_blocks_total;
  const std::string id = node.id;
  nodes_.emplace(id, std::move(node));
  return id;
}

Result<NodeState> NodeRegistry::heartbeat(const std::string& id, const Json& body,
                                          Clock::time_point now) {
  std::lock_guard lock(mutex_);
  Node* node = find(id);
  if (node == nullptr && retired_.contains(id)) {
    return failed_precondition("node '" + id + "' was drained and has left the cluster");
  }
  if (node == nullptr) return not_found("heartbeat from unknown node '" + id + "'");
  // A refused report changes nothing: not the load, nor the node's liveness.
  PDS_ASSIGN_OR_RETURN(const Heartbeat heartbeat, Heartbeat::parse(body));
  node->load = heartbeat.load;
  if (heartbeat.prefix_cache) node->prefix_keys.apply(*heartbeat.prefix_cache);
  if (heartbeat.tiered_cache) node->tiered_keys.apply(*heartbeat.tiered_cache);
  node->last_heartbeat = now;
  if (heartbeat.draining) {
    node->state = NodeState::kDraining;  // another proxy drained it (Heartbeat::draining)
  } else if (node->state == NodeState::kDown) {
    node->state = NodeState::kUp;
  }
  return node->state;
}

Status NodeRegistry::remove(const std::string& id) {
  std::lock_guard lock(mutex_);
  if (nodes_.erase(id) == 0) return not_found("unknown node '" + id + "'");
  return Status::ok_status();
}

Status NodeRegistry::drain(const std::string& id) {
  std::lock_guard lock(mutex_);
  Node* node = find(id);
  if (node == nullptr) return not_found("unknown node '" + id + "'");
  node->state = NodeState::kDraining;
  return Status::ok_status();
}

std::vector<std::string> NodeRegistry::expire(Clock::time_point now) {
  std::lock_guard lock(mutex_);
  std::vector<std::string> silent;
  std::erase_if(nodes_, [&](const auto& entry) {
    const Node& node = entry.second;
    if (node.state == NodeState::kDraining && node.in_flight == 0) {
      retired_.insert(node.id);
      return true;
    }
    if (node.state != NodeState::kDraining && !node.is_static &&
        now - node.last_heartbeat > options_.heartbeat_timeout) {
      silent.push_back(node.id);
      return true;
    }
    return false;
  });
  return silent;
}

void NodeRegistry::mark_down(const std::string& id, Clock::time_point now) {
  std::lock_guard lock(mutex_);
  Node* node = find(id);
  if (node == nullptr || node->state == NodeState::kDraining) return;
  node->state = NodeState::kDown;
  if (node->is_static) node->down_until = now + options_.static_down_cooldown;
}

bool NodeRegistry::routable(const Node& node, Clock::time_point now) const {
  if (node.state == NodeState::kDraining) return false;
  if (node.is_static) {
    return node.state == NodeState::kUp || (node.down_until && now >= *node.down_until);
  }
  return node.state == NodeState::kUp && now - node.last_heartbeat <= options_.heartbeat_timeout;
}

std::optional<NodeRef> NodeRegistry::pick_decode(const std::vector<std::string>& excluded,
                                                 Clock::time_point now, const RoutingQuery& query) {
  std::lock_guard lock(mutex_);
  Chains chains(query);
  Node* best = nullptr;
  std::tuple<double, double, int, std::string> best_key;
  PrefixMatch best_match;
  for (auto& [id, node] : nodes_) {
    if (node.role != NodeRole::kDecode || !routable(node, now)) continue;
    if (std::ranges::find(excluded, id) != excluded.end()) continue;
    const std::span<const uint64_t> chain = chains.get(node.block_size());
    const PrefixMatch match = match_prefix(chain, node.prefix_keys, node.tiered_keys);
    DecodeCandidate candidate;
    candidate.kv_usage = node.load.kv_usage();
    candidate.sequences = node.load.num_running + node.load.num_waiting + node.in_flight;
    candidate.hit = prefix_hit(match, chain.size(), options_.weights);
    // Ties go to the load order used before cache-aware routing, then to the id.
    auto key = std::make_tuple(decode_cost(candidate, options_.weights), candidate.kv_usage,
                               candidate.sequences, id);
    if (best == nullptr || key < best_key) {
      best = &node;
      best_key = std::move(key);
      best_match = match;
    }
  }
  if (best == nullptr) return std::nullopt;
  const std::span<const uint64_t> chain = chains.get(best->block_size());
  touch(*best, chain, best_match);
  return NodeRef{best->id,
                 best->url,
                 best->base,
                 chain.size(),
                 best_match.pool_blocks,
                 best_match.tier_blocks,
                 best->block_size(),
                 best->in_flight_prompt_tokens};
}

std::vector<NodeRef> NodeRegistry::rank_prefill(Clock::time_point now, const RoutingQuery& query) {
  std::lock_guard lock(mutex_);
  Chains chains(query);
  struct Ranked {
    Node* node;
    size_t prompt_blocks;
    PrefixMatch match;
    std::tuple<double, int64_t, int, int> key;
  };
  std::vector<Ranked> candidates;
  for (auto& [id, node] : nodes_) {
    if (node.role != NodeRole::kPrefill || !routable(node, now)) continue;
    const std::span<const uint64_t> chain = chains.get(node.block_size());
    const PrefixMatch match = match_prefix(chain, node.prefix_keys, node.tiered_keys);
    PrefillCandidate candidate;
    candidate.outstanding_tokens = node.in_flight_prompt_tokens;
    candidate.hit = prefix_hit(match, chain.size(), options_.weights);
    // Ties go to the load order used before cache-aware routing.
    candidates.push_back(
        {&node, chain.size(), match,
         {prefill_cost(candidate, query.prompt_tokens, options_.weights),
          node.in_flight_prompt_tokens, node.load.num_waiting, node.in_flight}});
  }
  std::ranges::stable_sort(candidates, {}, &Ranked::key);
  std::vector<NodeRef> ranked;
  for (const Ranked& entry : candidates) {
    ranked.push_back({entry.node->id, entry.node->url, entry.node->base, entry.prompt_blocks,
                      entry.match.pool_blocks, entry.match.tier_blocks, entry.node->block_size(),
                      entry.node->in_flight_prompt_tokens});
  }
  if (!candidates.empty()) {
    Node& first = *candidates.front().node;
    touch(first, chains.get(first.block_size()), candidates.front().match);
  }
  return ranked;
}

void NodeRegistry::touch(Node& node, std::span<const uint64_t> chain, const PrefixMatch& match) {
  node.prefix_keys.touch(chain, match.blocks());
  node.tiered_keys.touch(chain, match.blocks());
}

void NodeRegistry::begin_request(const std::string& decode_id, const std::string& prefill_id,
                                 int64_t prompt_tokens) {
  std::lock_guard lock(mutex_);
  if (Node* node = find(decode_id)) ++node->in_flight;
  if (Node* node = find(prefill_id)) {
    ++node->in_flight;
    node->in_flight_prompt_tokens += prompt_tokens;
  }
}

void NodeRegistry::end_request(const std::string& decode_id, const std::string& prefill_id,
                               int64_t prompt_tokens) {
  std::lock_guard lock(mutex_);
  if (Node* node = find(decode_id)) node->in_flight = std::max(0, node->in_flight - 1);
  if (Node* node = find(prefill_id)) {
    node->in_flight = std::max(0, node->in_flight - 1);
    node->in_flight_prompt_tokens =
        std::max<int64_t>(0, node->in_flight_prompt_tokens - prompt_tokens);
  }
}

KvPeerList NodeRegistry::decode_kv_peers() {
  std::lock_guard lock(mutex_);
  KvPeerList peers;
  for (const auto& [id, node] : nodes_) {
    if (node.role != NodeRole::kDecode || node.kv_descriptor.empty()) continue;
    if (peers.kv_descriptors.size() == KvPeerList::kMaxDescriptors) break;
    peers.kv_descriptors.push_back(node.kv_descriptor);
  }
  return peers;
}

std::vector<std::string> NodeRegistry::decode_models(Clock::time_point now) {
  std::lock_guard lock(mutex_);
  std::set<std::string> models;
  for (const auto& [id, node] : nodes_) {
    if (node.role == NodeRole::kDecode && !node.model.empty() && routable(node, now)) {
      models.insert(node.model);
    }
  }
  return {models.begin(), models.end()};
}

size_t NodeRegistry::prefix_keys() {
  std::lock_guard lock(mutex_);
  size_t keys = 0;
  for (const auto& [id, node] : nodes_) keys += node.prefix_keys.size();
  return keys;
}

size_t NodeRegistry::tiered_keys() {
  std::lock_guard lock(mutex_);
  size_t keys = 0;
  for (const auto& [id, node] : nodes_) keys += node.tiered_keys.size();
  return keys;
}

bool NodeRegistry::has_node(NodeRole role, Clock::time_point now) {
  std::lock_guard lock(mutex_);
  return std::ranges::any_of(nodes_, [&](const auto& entry) {
    return entry.second.role == role && routable(entry.second, now);
  });
}

PoolLoad NodeRegistry::pool_load(NodeRole role, Clock::time_point now) {
  std::lock_guard lock(mutex_);
  PoolLoad pool;
  for (const auto& [id, node] : nodes_) {
    if (node.role != role || !routable(node, now)) continue;
    ++pool.nodes;
    pool.in_flight += node.in_flight;
    pool.queued_prompt_tokens += node.in_flight_prompt_tokens;
    pool.running += node.load.num_running;
    pool.waiting += node.load.num_waiting;
    pool.kv_blocks_total += node.load.kv_blocks_total;
    pool.kv_blocks_used += node.load.kv_blocks_used;
  }
  return pool;
}

Json NodeRegistry::to_json(Clock::time_point now) {
  std::lock_guard lock(mutex_);
  Json nodes = Json::array();
  for (const auto& [id, node] : nodes_) {
    const bool routed = routable(node, now);
    nodes.push_back(
        {{"id", id},
         {"role", node_role_name(node.role)},
         {"url", node.url},
         {"model", node.model},
         {"state", routed || node.state == NodeState::kDraining ? node_state_name(node.state)
                                                                : std::string_view("down")},
         {"static", node.is_static},
         {"kv_transfer", !node.kv_descriptor.empty()},
         {"last_heartbeat_ms_ago",
          std::chrono::duration_cast<std::chrono::milliseconds>(now - node.last_heartbeat).count()},
         {"load",
          {{"num_running", node.load.num_running},
           {"num_waiting", node.load.num_waiting},
           {"kv_blocks_total", node.load.kv_blocks_total},
           {"kv_blocks_used", node.load.kv_blocks_used},
           {"kv_usage", node.load.kv_usage()},
           {"proxy_in_flight", node.in_flight},
           {"proxy_in_flight_prompt_tokens", node.in_flight_prompt_tokens}}},
         {"prefix_cache",
          {{"block_size", node.prefix_keys.block_size()},
           {"keys", node.prefix_keys.size()}}},
         {"tiered_cache",
          {{"block_size", node.tiered_keys.block_size()},
           {"keys", node.tiered_keys.size()}}}});
  }
  return Json{{"nodes", std::move(nodes)}};
}

}  // namespace pdserve::proxy
