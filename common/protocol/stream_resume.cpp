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

Result<std::optional<SamplerRng::State>> read_sampler_state(FieldReader& reader) {
  std::optional<SamplerRng::State> state;
  if (SamplerRng::State read{}; reader.get_u64s("sampler_state", read, /*required=*/false)) {
    state = read;
  }
  PDS_RETURN_IF_ERROR(reader.status());
  return state;
}

void put_sampler_state(Json& json, const std::optional<SamplerRng::State>& state) {
  if (state) json["sampler_state"] = Json(*state);
}

// The response's id and created time, which both messages start with.
Status read_head(FieldReader& reader, const std::string& where, std::string& id,
                 int64_t& created) {
  id = reader.get<std::string>("id", "");
  created = reader.get<int64_t>("created", 0);
  PDS_RETURN_IF_ERROR(reader.status());
  if (id.empty()) return invalid_argument(where + ": 'id' is empty");
  return Status::ok_status();
}

}  // namespace

Json StreamCheckpoint::to_json() const {
  Json json = {{"id", id},         {"created", created},    {"choices", choices},
               {"index", index},   {"token_ids", token_ids}};
  put_sampler_state(json, sampler_state);
  return json;
}

std::string StreamCheckpoint::to_comment() const {
  return std::string(kStreamCheckpointPrefix) + to_json().dump() + "\n\n";
}

Result<StreamCheckpoint> StreamCheckpoint::parse_comment(std::string_view event) {
  const std::string where = "the stream checkpoint";
  if (!event.starts_with(kStreamCheckpointPrefix)) {
    return invalid_argument(where + " does not start with '" +
                            std::string(kStreamCheckpointPrefix) + "'");
  }
  PDS_ASSIGN_OR_RETURN(const Json json,
                       parse_object(event.substr(kStreamCheckpointPrefix.size()), where));
  return parse(json);
}

Result<StreamCheckpoint> StreamCheckpoint::parse(const Json& json) {
  const std::string where = "the stream checkpoint";
  if (!json.is_object()) return invalid_argument(where + " is not a JSON object");
  FieldReader reader(json, where);
  StreamCheckpoint checkpoint;
  PDS_RETURN_IF_ERROR(read_head(reader, where, checkpoint.id, checkpoint.created));
  checkpoint.choices = reader.get<int>("choices", 1, /*required=*/false);
  checkpoint.index = reader.get<int>("index", 0, /*required=*/false);
  checkpoint.token_ids = reader.get_ids("token_ids");
  PDS_ASSIGN_OR_RETURN(checkpoint.sampler_state, read_sampler_state(reader));
  if (checkpoint.choices < 1 || checkpoint.choices > kMaxStreamChoices) {
    return invalid_argument(where + ": 'choices' must be 1 to " +
                            std::to_string(kMaxStreamChoices));
  }
  if (checkpoint.index < 0 || checkpoint.index >= checkpoint.choices) {
    return invalid_argument(where + ": 'index' must be below 'choices'");
  }
  return checkpoint;
}

Json StreamResume::to_json() const {
  Json entries = Json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    Json entry = {{"index", i},
                  {"output_token_ids", choices[i].output_token_ids},
                  {"finished", choices[i].finished}};
    put_sampler_state(entry, choices[i].sampler_state);
    entries.push_back(std::move(entry));
  }
  return {{"id", id}, {"created", created}, {"choices", std::move(entries)}};
}

Result<StreamResume> StreamResume::parse(const Json& json) {
  const std::string where = std::string("'") + kStreamResumeField + "'";
  if (!json.is_object()) return invalid_argument(where + " is not a JSON object");
  FieldReader reader(json, where);
  StreamResume resume;
  PDS_RETURN_IF_ERROR(read_head(reader, where, resume.id, resume.created));
  const auto entries = json.find("choices");
  if (entries == json.end() || !entries->is_array() || entries->empty() ||
      entries->size() > static_cast<size_t>(kMaxStreamChoices)) {
    return invalid_argument(where + ": 'choices' must be an array of 1 to " +
                            std::to_string(kMaxStreamChoices) + " choices");
  }
  for (size_t i = 0; i < entries->size(); ++i) {
    const std::string entry_where = where + ".choices[" + std::to_string(i) + "]";
    const Json& entry = (*entries)[i];
    if (!entry.is_object()) return invalid_argument(entry_where + " is not a JSON object");
    FieldReader fields(entry, entry_where);
    if (fields.get<int64_t>("index", -1) != static_cast<int64_t>(i)) {
      PDS_RETURN_IF_ERROR(fields.status());
      return invalid_argument(entry_where + ": 'index' must be " + std::to_string(i) +
                              " (every choice, in order)");
    }
    ResumedChoice choice;
    choice.output_token_ids = fields.get_ids("output_token_ids");
    choice.finished = fields.get<bool>("finished", false, /*required=*/false);
    PDS_ASSIGN_OR_RETURN(choice.sampler_state, read_sampler_state(fields));
    if (!choice.finished && !choice.output_token_ids.empty() && !choice.sampler_state) {
      return invalid_argument(entry_where +
                              ": 'sampler_state' is missing (needed after a token)");
    }
    resume.choices.push_back(std::move(choice));
  }
  return resume;
}

}  // namespace pdserve
