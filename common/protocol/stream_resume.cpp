#include "common/protocol/stream_resume.h"

#include "common/core/json_depth.h"
#include "common/core/json_fields.h"

namespace pdserve {
namespace {

using Json = nlohmann::json;

Result<Json> parse_object(std::string_view text, const std::string& where) {
  PDS_ASSIGN_OR_RETURN(Json json, parse_json_bounded(text, where));
  if (!json.is_object()) return invalid_argument(where + " is not a JSON object");
  return json;
}

// Both messages carry the same four fields; only the name of the token list differs.
struct StreamFields {
  std::string id;
  int64_t created = 0;
  std::vector<int32_t> tokens;
  std::optional<SamplerRng::State> sampler_state;
};

Json fields_json(const StreamFields& fields, const char* tokens_key) {
  Json json = {{"id", fields.id}, {"created", fields.created}, {tokens_key, fields.tokens}};
  if (fields.sampler_state) json["sampler_state"] = Json(*fields.sampler_state);
  return json;
}

Result<StreamFields> read_fields(const Json& json, const std::string& where,
                                 const char* tokens_key) {
  FieldReader reader(json, where);
  StreamFields fields;
  fields.id = reader.get<std::string>("id", "");
  fields.created = reader.get<int64_t>("created", 0);
  fields.tokens = reader.get_ids(tokens_key);
  if (SamplerRng::State state{}; reader.get_u64s("sampler_state", state, /*required=*/false)) {
    fields.sampler_state = state;
  }
  PDS_RETURN_IF_ERROR(reader.status());
  if (fields.id.empty()) return invalid_argument(where + ": 'id' is empty");
  return fields;
}

}  // namespace

std::string StreamCheckpoint::to_comment() const {
  const Json json = fields_json({id, created, token_ids, sampler_state}, "token_ids");
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
  PDS_ASSIGN_OR_RETURN(StreamFields fields, read_fields(json, where, "token_ids"));
  return StreamCheckpoint{std::move(fields.id), fields.created, std::move(fields.tokens),
                          fields.sampler_state};
}

Json StreamResume::to_json() const {
  return fields_json({id, created, output_token_ids, sampler_state}, "output_token_ids");
}

Result<StreamResume> StreamResume::parse(const Json& json) {
  const std::string where = std::string("'") + kStreamResumeField + "'";
  if (!json.is_object()) return invalid_argument(where + " is not a JSON object");
  PDS_ASSIGN_OR_RETURN(StreamFields fields, read_fields(json, where, "output_token_ids"));
  if (!fields.tokens.empty() && !fields.sampler_state) {
    return invalid_argument(where + ": 'sampler_state' is missing (needed after a token)");
  }
  return StreamResume{std::move(fields.id), fields.created, std::move(fields.tokens),
                      fields.sampler_state};
}

}  // namespace pdserve
