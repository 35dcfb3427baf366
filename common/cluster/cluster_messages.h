// The messages between a node and the proxy, typed, each with one serialiser and one parser
// (the parser validates; what it refuses is a 400 at the proxy):
//   POST /cluster/nodes                NodeRegistration  -> RegistrationReply
//   POST /cluster/nodes/ID/heartbeat   Heartbeat         -> HeartbeatReply
// The prefill protocol has its own types (common/protocol/prefill_protocol.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

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

  nlohmann::json to_json() const;
  // InvalidArgument for a missing or malformed field (the URL must parse as http://HOST:PORT).
  static Result<NodeRegistration> parse(const nlohmann::json& json);
  bool operator==(const NodeRegistration&) const = default;
};

struct RegistrationReply {
  std::string id;

  nlohmann::json to_json() const;
  static Result<RegistrationReply> parse(const nlohmann::json& json);
};

struct Heartbeat {
  NodeLoad load;

  nlohmann::json to_json() const;
  static Result<Heartbeat> parse(const nlohmann::json& json);
};

struct HeartbeatReply {
  std::string id;
  NodeState state = NodeState::kUp;  // kUp or kDraining

  nlohmann::json to_json() const;
  static Result<HeartbeatReply> parse(const nlohmann::json& json);
};

}  // namespace pdserve
