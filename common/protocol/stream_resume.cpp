#include "common/protocol/stream_resume.h"

#include "common/core/json_depth.h"
#include "common/core/json_fields.h"

namespace pdserve {
namespace {

using Json = nlohmann::json;

Json state_json(const SamplerRng::State& state) { return Json(state); }

// `name` as a sampler state (four unsigned 64-bit integers), nullopt when absent.
std::optional<SamplerRng::State> read_state(const Json& object, const char* name,
                                            FieldReader& reader) {
  const auto it = object.find(name);
  if (it == object.end() || it->is_null()) return std::nullopt;
  SamplerRng::State state{};
  if (!it->is_array() || it->size() != state.size()) {
    reader.fail(std::string("'") + name + "' must hold 4 unsigned integers");
    return std::nullopt;
  }
  for (size_t i = 0; i < state.size(); ++i) {
    if (!(*it)[i].is_number_unsigned()) {
      reader.fail(std::string("'") + name + "' must hold 4 unsigned integers");
      return std::nullopt;
    }
    state[i] = (*it)[i].get<uint64_t>();
  }
  return state;
}

Result<Json> parse_object(std::string_view text, const std::string& where) {
  PDS_ASSIGN_OR_RETURN(Json json, parse_json_bounded(text, where));
  if (!json.is_object()) return invalid_argument(where + " is not a JSON object");
  return json;
}

}  // namespace

std::string StreamCheckpoint::to_comment() const {
  Json json = {{"id", id}, {"created", created}, {"token_ids", token_ids}};
  if (sampler_state) json["sampler_state"] = state_json(*sampler_state);
  return std::string(kStreamCheckpointPrefix) + json.dump() + "\n\n";
}

Result<StreamCheckpoint> StreamCheckpoint::parse_comment(std::string_view event) {
  const std::string where = "the stream checkpoint";
  if (!event.starts_with(kStreamCheckpointPrefix)) {
    return invalid_argument(where + " does not start with '" +
                            std::string(kStreamCheckpointPrefix) + "'");
  }
  PDS_ASSIGN_OR_RETURN(const Json json,
                       parse_object(event.substr(kStreamCheckpointPrefix.size()), where));
  FieldReader reader(json, where);
  StreamCheckpoint checkpoint;
  checkpoint.id = reader.get<std::string>("id", "");
  checkpoint.created = reader.get<int64_t>("created", 0);
  checkpoint.token_ids = reader.get_ids("token_ids");
  checkpoint.sampler_state = read_state(json, "sampler_state", reader);
  PDS_RETURN_IF_ERROR(reader.status());
  if (checkpoint.id.empty()) return invalid_argument(where + ": 'id' is empty");
  return checkpoint;
}

Json StreamResume::to_json() const {
  Json json = {{"id", id}, {"created", created}, {"output_token_ids", output_token_ids}};
  if (sampler_state) json["sampler_state"] = state_json(*sampler_state);
  return json;
}

Result<StreamResume> StreamResume::parse(const Json& json) {
  const std::string where = std::string("'") + kStreamResumeField + "'";
  if (!json.is_object()) return invalid_argument(where + " is not a JSON object");
  FieldReader reader(json, where);
  StreamResume resume;
  resume.id = reader.get<std::string>("id", "");
  resume.created = reader.get<int64_t>("created", 0);
  resume.output_token_ids = reader.get_ids("output_token_ids");
  resume.sampler_state = read_state(json, "sampler_state", reader);
  PDS_RETURN_IF_ERROR(reader.status());
  if (resume.id.empty()) return invalid_argument(where + ": 'id' is empty");
  if (!resume.output_token_ids.empty() && !resume.sampler_state) {
    return invalid_argument(where + ": 'sampler_state' is missing (needed after a token)");
  }
  return resume;
}

}  // namespace pdserve
