#include "common/cluster/cluster_messages.h"

#include "common/core/json_fields.h"
#include "common/http/http_client.h"

namespace pdserve {
namespace {

using Json = nlohmann::json;

Status not_an_object(std::string_view what) {
  return invalid_argument(std::string(what) + ": the body is not a JSON object");
}

// An optional count: 0 when absent, else an integer of T from 0 up.
template <typename T>
T read_count(FieldReader& reader, const char* name) {
  const T value = reader.get<T>(name, 0, /*required=*/false);
  if (value < 0) reader.fail(std::string("'") + name + "' must be an integer >= 0");
  return value < 0 ? 0 : value;
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
  if (!json.is_object()) return invalid_argument("heartbeat: 'load' must be an object");
  FieldReader reader(json, "heartbeat load");
  NodeLoad load;
  load.num_running = read_count<int>(reader, "num_running");
  load.num_waiting = read_count<int>(reader, "num_waiting");
  load.kv_blocks_total = read_count<int>(reader, "kv_blocks_total");
  load.kv_blocks_used = read_count<int>(reader, "kv_blocks_used");
  load.prompt_tokens_total = read_count<int64_t>(reader, "prompt_tokens_total");
  load.generation_tokens_total = read_count<int64_t>(reader, "generation_tokens_total");
  PDS_RETURN_IF_ERROR(reader.status());
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
  if (!json.is_object()) return not_an_object("registration");
  const auto role = json.find("role");
  if (role == json.end() || (*role != "prefill" && *role != "decode")) {
    return invalid_argument("'role' must be \"prefill\" or \"decode\"");
  }
  FieldReader reader(json, "registration");
  NodeRegistration registration;
  registration.role = *role == "prefill" ? NodeRole::kPrefill : NodeRole::kDecode;
  const std::string url = reader.get<std::string>("url", "");
  registration.model = reader.get<std::string>("model", "", /*required=*/false);
  registration.kv_descriptor = reader.get<std::string>("kv_descriptor", "", /*required=*/false);
  registration.kv_blocks_total = read_count<int>(reader, "kv_blocks_total");
  PDS_RETURN_IF_ERROR(reader.status());
  PDS_ASSIGN_OR_RETURN(const http::BaseUrl base, http::parse_base_url(url));
  registration.url = base.to_string();
  return registration;
}

Json RegistrationReply::to_json() const { return {{"id", id}}; }

Result<RegistrationReply> RegistrationReply::parse(const Json& json) {
  if (!json.is_object()) return not_an_object("registration answer");
  FieldReader reader(json, "registration answer");
  RegistrationReply reply{reader.get<std::string>("id", "")};
  PDS_RETURN_IF_ERROR(reader.status());
  if (reply.id.empty()) return invalid_argument("registration answer: no 'id'");
  return reply;
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
  if (!json.is_object()) return not_an_object("heartbeat answer");
  FieldReader reader(json, "heartbeat answer");
  HeartbeatReply reply;
  reply.id = reader.get<std::string>("id", "", /*required=*/false);
  const std::string state = reader.get<std::string>("state", "up", /*required=*/false);
  PDS_RETURN_IF_ERROR(reader.status());
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
