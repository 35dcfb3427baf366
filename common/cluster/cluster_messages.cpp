#include "common/cluster/cluster_messages.h"

#include <charconv>
#include <cstdio>
#include <unordered_set>

#include "common/core/json_fields.h"
#include "common/http/http_client.h"
#include "common/tokenizer/tokenizer_files.h"

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

std::string hash_to_hex(uint64_t hash) {
  char digits[17];
  std::snprintf(digits, sizeof(digits), "%016llx", static_cast<unsigned long long>(hash));
  return digits;
}

// The keys of `name`: an array of 16-hex-digit strings, each new to `seen`.
Result<std::vector<uint64_t>> read_hashes(const Json& report, std::string_view report_name,
                                          const char* name, std::unordered_set<uint64_t>& seen) {
  std::vector<uint64_t> hashes;
  const auto field = report.find(name);
  if (field == report.end()) return hashes;
  const std::string where = std::string(report_name) + ": '" + name + "'";
  if (!field->is_array()) {
    return invalid_argument(where + " must be an array of 16-hex-digit strings");
  }
  if (field->size() > kMaxPrefixReportHashes) {
    return invalid_argument(where + " holds " + std::to_string(field->size()) +
                            " keys, more than " + std::to_string(kMaxPrefixReportHashes));
  }
  hashes.reserve(field->size());
  for (const Json& value : *field) {
    const std::string* text = value.get_ptr<const std::string*>();
    uint64_t hash = 0;
    const bool lower_hex = text != nullptr && text->size() == 16 &&
                           text->find_first_not_of("0123456789abcdef") == std::string::npos;
    if (!lower_hex ||
        std::from_chars(text->data(), text->data() + text->size(), hash, 16).ec != std::errc()) {
      return invalid_argument(where + " holds " + value.dump().substr(0, 40) +
                              ", not 16 lowercase hex digits");
    }
    if (!seen.insert(hash).second) {
      return invalid_argument(where + ": key " + *text + " is listed twice");
    }
    hashes.push_back(hash);
  }
  return hashes;
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
          {"kv_blocks_total", kv_blocks_total},
          {"tokenizer_sha256", tokenizer_sha256}};
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
  registration.tokenizer_sha256 =
      reader.get<std::string>("tokenizer_sha256", "", /*required=*/false);
  PDS_RETURN_IF_ERROR(reader.status());
  if (!registration.tokenizer_sha256.empty() && !is_sha256_hex(registration.tokenizer_sha256)) {
    return invalid_argument("registration: 'tokenizer_sha256' must be 64 lowercase hex digits");
  }
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

Json PrefixCacheReport::to_json() const {
  Json stored_hex = Json::array();
  for (uint64_t hash : stored) stored_hex.push_back(hash_to_hex(hash));
  Json removed_hex = Json::array();
  for (uint64_t hash : removed) removed_hex.push_back(hash_to_hex(hash));
  return {{"block_size", block_size},
          {"reset", reset},
          {"stored", std::move(stored_hex)},
          {"removed", std::move(removed_hex)}};
}

Result<PrefixCacheReport> PrefixCacheReport::parse(const Json& json, std::string_view field) {
  const std::string name(field);
  if (!json.is_object()) return invalid_argument("heartbeat: '" + name + "' must be an object");
  FieldReader reader(json, name);
  PrefixCacheReport report;
  report.block_size = reader.get<int>("block_size", 0);
  report.reset = reader.get<bool>("reset", false, /*required=*/false);
  PDS_RETURN_IF_ERROR(reader.status());
  if (report.block_size < 1 || report.block_size > 4096) {
    return invalid_argument(name + ": 'block_size' must be in 1..4096, not " +
                            std::to_string(report.block_size));
  }
  std::unordered_set<uint64_t> seen;  // a key in both lists has no meaning
  PDS_ASSIGN_OR_RETURN(report.stored, read_hashes(json, name, "stored", seen));
  PDS_ASSIGN_OR_RETURN(report.removed, read_hashes(json, name, "removed", seen));
  if (report.stored.size() + report.removed.size() > kMaxPrefixReportHashes) {
    return invalid_argument(name + ": more than " + std::to_string(kMaxPrefixReportHashes) +
                            " keys in all");
  }
  if (report.reset && !report.removed.empty()) {
    return invalid_argument(name + ": a 'reset' report lists no 'removed' keys");
  }
  return report;
}

Json Heartbeat::to_json() const {
  Json json = {{"load", load.to_json()}};
  if (prefix_cache) json["prefix_cache"] = prefix_cache->to_json();
  if (tiered_cache) json["tiered_cache"] = tiered_cache->to_json();
  if (draining) json["draining"] = true;
  return json;
}

Result<Heartbeat> Heartbeat::parse(const Json& json) {
  if (!json.is_object()) return not_an_object("heartbeat");
  Heartbeat heartbeat;
  if (const auto load = json.find("load"); load != json.end()) {
    PDS_ASSIGN_OR_RETURN(heartbeat.load, NodeLoad::parse(*load));
  }
  if (const auto report = json.find("prefix_cache"); report != json.end()) {
    PDS_ASSIGN_OR_RETURN(heartbeat.prefix_cache, PrefixCacheReport::parse(*report));
  }
  if (const auto report = json.find("tiered_cache"); report != json.end()) {
    PDS_ASSIGN_OR_RETURN(heartbeat.tiered_cache, PrefixCacheReport::parse(*report, "tiered_cache"));
  }
  FieldReader reader(json, "heartbeat");
  heartbeat.draining = reader.get<bool>("draining", false, /*required=*/false);
  PDS_RETURN_IF_ERROR(reader.status());
  return heartbeat;
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

Json KvPeerList::to_json() const {
  return {{"kv_descriptors", kv_descriptors}};
}

Result<KvPeerList> KvPeerList::parse(const Json& json) {
  if (!json.is_object()) return not_an_object("KV peer list");
  const auto field = json.find("kv_descriptors");
  if (field == json.end() || !field->is_array()) {
    return invalid_argument("KV peer list: 'kv_descriptors' must be an array of strings");
  }
  if (field->size() > kMaxDescriptors) {
    return invalid_argument("KV peer list: more than " + std::to_string(kMaxDescriptors) +
                            " descriptors");
  }
  KvPeerList list;
  for (const Json& value : *field) {
    const std::string* text = value.get_ptr<const std::string*>();
    if (text == nullptr) {
      return invalid_argument("KV peer list: 'kv_descriptors' holds a non-string");
    }
    list.kv_descriptors.push_back(*text);
  }
  return list;
}

}  // namespace pdserve
