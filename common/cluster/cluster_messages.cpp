#include "common/cluster/cluster_messages.h"

#include <limits>

#include "common/http/http_client.h"

namespace pdserve {
namespace {

using Json = nlohmann::json;

Status not_an_object(std::string_view what) {
  return invalid_argument(std::string(what) + ": the body is not a JSON object");
}

// An integer from 0 to `max`; 0 when absent.
Result<int64_t> read_count(const Json& object, const char* name, std::string_view where,
                           int64_t max) {
  const auto it = object.find(name);
  if (it == object.end()) return 0;
  if (!it->is_number_integer() || (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(max)) ||
      it->get<int64_t>() < 0 || it->get<int64_t>() > max) {
    return invalid_argument(std::string(where) + ": '" + name + "' must be an integer from 0 to " +
                            std::to_string(max));
  }
  return it->get<int64_t>();
}

Result<int> read_int_count(const Json& object, const char* name, std::string_view where) {
  PDS_ASSIGN_OR_RETURN(const int64_t value,
                       read_count(object, name, where, std::numeric_limits<int>::max()));
  return static_cast<int>(value);
}

// A string field; `fallback` when absent.
Result<std::string> read_string(const Json& object, const char* name, std::string_view where,
                                std::string fallback) {
  const auto it = object.find(name);
  if (it == object.end()) return fallback;
  if (!it->is_string()) {
    return invalid_argument(std::string(where) + ": '" + name + "' must be a string");
  }
  return it->get<std::string>();
}

}  // namespace

std::string_view node_role_name(NodeRole role) {
  return role == NodeRole::kPrefill ? "prefill" : "decode";
}

std::string_view node_state_name(NodeState state) {
  switch (state) {
    case NodeState::kUp:
      return "up";
    case NodeState::kDown:
      return "down";
    case NodeState::kDraining:
      return "draining";
  }
  return "down";
}

Json NodeLoad::to_json() const {
  return {{"num_running", num_running},
          {"num_waiting", num_waiting},
          {"kv_blocks_total", kv_blocks_total},
          {"kv_blocks_used", kv_blocks_used},
          {"prompt_tokens_total", prompt_tokens_total},
          {"generation_tokens_total", generation_tokens_total}};
}

Result<NodeLoad> NodeLoad::parse(const Json& json) {
  constexpr std::string_view kWhere = "heartbeat load";
  if (!json.is_object()) return invalid_argument("heartbeat: 'load' must be an object");
  NodeLoad load;
  PDS_ASSIGN_OR_RETURN(load.num_running, read_int_count(json, "num_running", kWhere));
  PDS_ASSIGN_OR_RETURN(load.num_waiting, read_int_count(json, "num_waiting", kWhere));
  PDS_ASSIGN_OR_RETURN(load.kv_blocks_total, read_int_count(json, "kv_blocks_total", kWhere));
  PDS_ASSIGN_OR_RETURN(load.kv_blocks_used, read_int_count(json, "kv_blocks_used", kWhere));
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  PDS_ASSIGN_OR_RETURN(load.prompt_tokens_total,
                       read_count(json, "prompt_tokens_total", kWhere, kMax));
  PDS_ASSIGN_OR_RETURN(load.generation_tokens_total,
                       read_count(json, "generation_tokens_total", kWhere, kMax));
  if (load.kv_blocks_used > load.kv_blocks_total) {
    return invalid_argument("heartbeat load: 'kv_blocks_used' (" +
                            std::to_string(load.kv_blocks_used) + ") exceeds 'kv_blocks_total' (" +
                            std::to_string(load.kv_blocks_total) + ")");
  }
  return load;
}

Json NodeRegistration::to_json() const {
  return {{"role", node_role_name(role)},
          {"url", url},
          {"model", model},
          {"kv_descriptor", kv_descriptor},
          {"kv_blocks_total", kv_blocks_total}};
}

Result<NodeRegistration> NodeRegistration::parse(const Json& json) {
  constexpr std::string_view kWhere = "registration";
  if (!json.is_object()) return not_an_object(kWhere);
  NodeRegistration registration;
  const auto role = json.find("role");
  if (role == json.end() || (*role != "prefill" && *role != "decode")) {
    return invalid_argument("'role' must be \"prefill\" or \"decode\"");
  }
  registration.role = *role == "prefill" ? NodeRole::kPrefill : NodeRole::kDecode;
  const auto url = json.find("url");
  if (url == json.end() || !url->is_string()) {
    return invalid_argument("registration: 'url' must be a string");
  }
  PDS_ASSIGN_OR_RETURN(const http::BaseUrl base, http::parse_base_url(url->get<std::string>()));
  registration.url = base.to_string();
  PDS_ASSIGN_OR_RETURN(registration.model, read_string(json, "model", kWhere, ""));
  PDS_ASSIGN_OR_RETURN(registration.kv_descriptor, read_string(json, "kv_descriptor", kWhere, ""));
  PDS_ASSIGN_OR_RETURN(registration.kv_blocks_total,
                       read_int_count(json, "kv_blocks_total", kWhere));
  return registration;
}

Json RegistrationReply::to_json() const { return {{"id", id}}; }

Result<RegistrationReply> RegistrationReply::parse(const Json& json) {
  if (!json.is_object()) return not_an_object("registration answer");
  PDS_ASSIGN_OR_RETURN(std::string id, read_string(json, "id", "registration answer", ""));
  if (id.empty()) return invalid_argument("registration answer: no 'id'");
  return RegistrationReply{std::move(id)};
}

Json Heartbeat::to_json() const { return {{"load", load.to_json()}}; }

Result<Heartbeat> Heartbeat::parse(const Json& json) {
  if (!json.is_object()) return not_an_object("heartbeat");
  const auto load = json.find("load");
  if (load == json.end()) return Heartbeat{};
  PDS_ASSIGN_OR_RETURN(NodeLoad parsed, NodeLoad::parse(*load));
  return Heartbeat{parsed};
}

Json HeartbeatReply::to_json() const {
  return {{"id", id}, {"ok", true}, {"state", node_state_name(state)}};
}

Result<HeartbeatReply> HeartbeatReply::parse(const Json& json) {
  constexpr std::string_view kWhere = "heartbeat answer";
  if (!json.is_object()) return not_an_object(kWhere);
  HeartbeatReply reply;
  PDS_ASSIGN_OR_RETURN(reply.id, read_string(json, "id", kWhere, ""));
  PDS_ASSIGN_OR_RETURN(const std::string state, read_string(json, "state", kWhere, "up"));
  if (state == "up") {
    reply.state = NodeState::kUp;
  } else if (state == "draining") {
    reply.state = NodeState::kDraining;
  } else {
    return invalid_argument("heartbeat answer: 'state' must be \"up\" or \"draining\"");
  }
  return reply;
}

}  // namespace pdserve
