// The messages between a node and the proxy, typed, each with one serialiser and one parser
// (the parser validates; what it refuses is a 400 at the proxy):
//   POST /cluster/nodes                NodeRegistration  -> RegistrationReply
//   POST /cluster/nodes/ID/heartbeat   Heartbeat         -> HeartbeatReply
//   GET  /cluster/kv-peers                                -> KvPeerList
//   GET  /cluster/tokenizer (at a node)                   -> TokenizerFiles (its to_json)
// The prefill protocol has its own types (common/protocol/prefill_protocol.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/core/status.h"

namespace pdserve {

enum class NodeRole { kPrefill, kDecode };
// kUp: routable; kDown: missed heartbeats or failed (static nodes come back after a cooldown);
// kDraining: no new work, retired once idle.
enum class NodeState { kUp, kDown, kDraining };

std::string_view node_role_name(NodeRole role);    // "prefill", "decode"
std::string_view node_state_name(NodeState state);  // "up", "down", "draining"

// What a node reports of its load. Every count is an integer >= 0 and kv_blocks_used <=
// kv_blocks_total: a negative or wrapped count would make a node look empty and win every
// routing decision.
struct NodeLoad {
  int num_running = 0;
  int num_waiting = 0;
  int kv_blocks_total = 0;
  int kv_blocks_used = 0;
  int64_t prompt_tokens_total = 0;      // since the node started
  int64_t generation_tokens_total = 0;  // since the node started

  double kv_usage() const {
    return kv_blocks_total > 0 ? static_cast<double>(kv_blocks_used) / kv_blocks_total : 0.0;
  }
  nlohmann::json to_json() const;
  // An absent count is 0. InvalidArgument naming the field.
  static Result<NodeLoad> parse(const nlohmann::json& json);
  bool operator==(const NodeLoad&) const = default;
};

struct NodeRegistration {
  NodeRole role = NodeRole::kDecode;
  std::string url;            // http://HOST:PORT where the proxy and other nodes reach the node
  std::string model;          // the served model name ("" for none)
  std::string kv_descriptor;  // base64 UCX worker address and pool key ("" without KV transfer)
  int kv_blocks_total = 0;
  // The identity of the node's tokenizer (common/tokenizer/tokenizer_files.h): 64 lowercase
  // hex digits, or "" when the node advertises none (the proxy then checks nothing).
  std::string tokenizer_sha256;

  nlohmann::json to_json() const;
  // InvalidArgument for a missing or malformed field (the URL must parse as http://HOST:PORT;
  // tokenizer_sha256, optional, must be 64 lowercase hex digits).
  static Result<NodeRegistration> parse(const nlohmann::json& json);
  bool operator==(const NodeRegistration&) const = default;
};

struct RegistrationReply {
  std::string id;

  nlohmann::json to_json() const;
  static Result<RegistrationReply> parse(const nlohmann::json& json);
};

// Most block keys one prefix-cache report carries (stored and removed together): about
// 160 KB of JSON. A node with more changes between two heartbeats sends a snapshot instead.
inline constexpr size_t kMaxPrefixReportHashes = 8192;

// What changed in a node's prefix cache since its last delivered report: the chained keys
// (common/engine/block_hash.h) of the full blocks it registered (`stored`) and dropped
// (`removed`), each key at most once and in one list only. With `reset` the proxy first forgets
// what it knew of the node (`stored` is then a snapshot and `removed` is empty). On the wire a key
// is 16 lowercase hex digits: JSON numbers above 2^53 do not survive every parser.
struct PrefixCacheReport {
  int block_size = 0;  // tokens per block, 1..4096: the proxy hashes prompts with it
  bool reset = false;
  std::vector<uint64_t> stored;
  std::vector<uint64_t> removed;

  nlohmann::json to_json() const;
  // InvalidArgument naming the field (prefixed with `field`, the heartbeat's field it came in):
  // a bad block size, a key that is not 16 hex digits, more than kMaxPrefixReportHashes keys, a
  // key in both lists, removals with `reset`.
  static Result<PrefixCacheReport> parse(const nlohmann::json& json,
                                         std::string_view field = "prefix_cache");
  bool operator==(const PrefixCacheReport&) const = default;
};

struct Heartbeat {
  NodeLoad load;
  std::optional<PrefixCacheReport> prefix_cache;  // absent: the prefix cache did not change
  // The same report for the blocks the node holds in its lower KV tiers (host memory, disk;
  // common/engine/tiered_key_source.h), a stream of its own with the same bound and snapshot
  // rules: absent when nothing changed there or the node has no tiers. The proxy keeps it in a
  // second index per node and scores its hits below pool hits (proxy/routing/prefix_routing.h).
  std::optional<PrefixCacheReport> tiered_cache = std::nullopt;
  // The node is draining: another proxy of its cluster drained it, and this one must stop
  // sending it work too (a node registered with several proxies is drained at each).
  bool draining = false;

  nlohmann::json to_json() const;
  static Result<Heartbeat> parse(const nlohmann::json& json);
};

struct HeartbeatReply {
  std::string id;
  NodeState state = NodeState::kUp;  // kUp or kDraining

  nlohmann::json to_json() const;
  static Result<HeartbeatReply> parse(const nlohmann::json& json);
};

// The KV descriptors of the decode nodes registered at a proxy: the only UCX workers a prefill
// node registered there sends KV to (issue #34; kv_transfer/kv_peer_allowlist.h).
struct KvPeerList {
  // A proxy answers at most this many (far more decode nodes than one proxy routes to).
  static constexpr size_t kMaxDescriptors = 4096;
  std::vector<std::string> kv_descriptors;  // base64, as each node registered it

  nlohmann::json to_json() const;
  // InvalidArgument for a body that is not {"kv_descriptors": [string...]} or holds too many.
  static Result<KvPeerList> parse(const nlohmann::json& json);
  bool operator==(const KvPeerList&) const = default;
};

}  // namespace pdserve
