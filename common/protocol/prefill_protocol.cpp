#include "common/protocol/prefill_protocol.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <utility>

#include "common/core/dtype.h"
#include "common/core/json_depth.h"
#include "common/core/json_fields.h"

namespace pdserve {
namespace {

using Json = nlohmann::json;

Json sampling_to_json(const SamplingParams& params) {
  Json json{{"temperature", params.temperature},
            {"top_p", params.top_p},
            {"top_k", params.top_k},
            {"min_p", params.min_p},
            {"repetition_penalty", params.repetition_penalty},
            {"presence_penalty", params.presence_penalty},
            {"frequency_penalty", params.frequency_penalty},
            {"logprobs", params.logprobs},
            {"want_logprobs", params.want_logprobs},
            {"max_tokens", params.max_tokens},
            {"min_tokens", params.min_tokens},
            {"ignore_eos", params.ignore_eos},
            {"stop_token_ids", params.stop_token_ids}};
  if (params.seed) json["seed"] = *params.seed;
  if (params.prompt_logprobs) json["prompt_logprobs"] = *params.prompt_logprobs;
  if (!params.logit_bias.empty()) {
    Json bias = Json::array();
    for (const LogitBias& entry : params.logit_bias) bias.push_back({entry.token, entry.bias});
    json["logit_bias"] = std::move(bias);
  }
  if (!params.scripted_output.empty()) json["scripted_output"] = params.scripted_output;
  if (params.structured_output) {
    json["structured_output"] = {
        {"kind", structured_output_kind_name(params.structured_output->kind)},
        {"spec", params.structured_output->spec}};
  }
  return json;
}

// [[token id, bias], ...]; absent means none. Ranges are the sampler's to check.
std::vector<LogitBias> logit_bias_from_json(const Json& json, FieldReader& reader) {
  std::vector<LogitBias> biases;
  const auto it = json.find("logit_bias");
  if (it == json.end() || it->is_null()) return biases;
  const auto valid_pair = [](const Json& pair) {
    return pair.is_array() && pair.size() == 2 && pair[0].is_number_integer() &&
           pair[0].get<int64_t>() >= 0 &&
           pair[0].get<int64_t>() <= std::numeric_limits<int32_t>::max() && pair[1].is_number();
  };
  if (!it->is_array() || !std::ranges::all_of(*it, valid_pair)) {
    reader.fail("'logit_bias' must be an array of [token id, bias] pairs");
    return {};
  }
  for (const Json& pair : *it) biases.push_back({pair[0].get<int32_t>(), pair[1].get<float>()});
  return biases;
}

SamplingParams sampling_from_json(const Json& json, FieldReader& reader) {
  SamplingParams params;
  params.temperature = reader.get<float>("temperature", params.temperature);
  params.top_p = reader.get<float>("top_p", params.top_p);
  params.top_k = reader.get<int>("top_k", params.top_k);
  params.min_p = reader.get<float>("min_p", params.min_p);
  params.repetition_penalty = reader.get<float>("repetition_penalty", params.repetition_penalty);
  params.presence_penalty = reader.get<float>("presence_penalty", params.presence_penalty);
  params.frequency_penalty = reader.get<float>("frequency_penalty", params.frequency_penalty);
  params.logprobs = reader.get<int>("logprobs", params.logprobs);
  params.want_logprobs = reader.get<bool>("want_logprobs", params.want_logprobs);
  params.max_tokens = reader.get<int>("max_tokens", params.max_tokens);
  params.min_tokens = reader.get<int>("min_tokens", params.min_tokens);
  params.ignore_eos = reader.get<bool>("ignore_eos", params.ignore_eos);
  params.stop_token_ids = reader.get_ids("stop_token_ids");
  const bool sampling_has_seed = json.contains("seed") && !json["seed"].is_null();
  const uint64_t seed = reader.get<uint64_t>("seed", 0, /*required=*/false);
  if (sampling_has_seed) params.seed = seed;
  if (json.contains("prompt_logprobs") && !json["prompt_logprobs"].is_null()) {
    params.prompt_logprobs = reader.get<int>("prompt_logprobs", 0);
  }
  params.logit_bias = logit_bias_from_json(json, reader);
  if (json.contains("scripted_output")) params.scripted_output = reader.get_ids("scripted_output");
  // The decode node's constraint: the prefill node samples the first token under it.
  if (const auto it = json.find("structured_output"); it != json.end() && !it->is_null()) {
    if (!it->is_object()) {
      reader.fail("'structured_output' is not an object");
      return params;
    }
    FieldReader output_reader(*it, "structured_output");
    const std::string kind = output_reader.get<std::string>("kind", "");
    std::string spec = output_reader.get<std::string>("spec", "");
    if (!output_reader.status().ok()) {
      reader.fail(output_reader.status().message());
      return params;
    }
    const std::optional<StructuredOutput::Kind> parsed = parse_structured_output_kind(kind);
    if (!parsed) {
      reader.fail("'structured_output.kind' is '" + kind + "'");
      return params;
    }
    params.structured_output = StructuredOutput{*parsed, std::move(spec)};
  }
  return params;
}

Json token_logprobs_to_json(const std::vector<TokenLogprob>& entries) {
  Json out = Json::array();
  for (const TokenLogprob& entry : entries)
    out.push_back(Json::array({entry.token, entry.logprob}));
  return out;
}

Json prompt_logprobs_to_json(const std::vector<PromptTokenLogprob>& positions) {
  Json out = Json::array();
  for (const PromptTokenLogprob& position : positions) {
    out.push_back(Json::array(
        {position.token, position.logprob, position.rank, token_logprobs_to_json(position.top)}));
  }
  return out;
}

bool is_token_logprob(const Json& entry) {
  return entry.is_array() && entry.size() == 2 && entry[0].is_number_integer() &&
         entry[1].is_number();
}

Result<std::vector<PromptTokenLogprob>> prompt_logprobs_from_json(const Json& json) {
  const auto invalid = [] {
    return invalid_argument(
        "prefill event: 'prompt_logprobs' entries are [token, logprob, rank, [[token, logprob], "
        "...]]");
  };
  if (!json.is_array()) return invalid();
  std::vector<PromptTokenLogprob> positions;
  positions.reserve(json.size());
  for (const Json& entry : json) {
    if (!entry.is_array() || entry.size() != 4 || !entry[0].is_number_integer() ||
        !entry[1].is_number() || !entry[2].is_number_integer() || !entry[3].is_array() ||
        !std::ranges::all_of(entry[3], is_token_logprob)) {
      return invalid();
    }
    PromptTokenLogprob& position = positions.emplace_back();
    position.token = entry[0].get<int32_t>();
    position.logprob = entry[1].get<float>();
    position.rank = entry[2].get<int>();
    for (const Json& top : entry[3]) {
      position.top.push_back({top[0].get<int32_t>(), top[1].get<float>()});
    }
  }
  return positions;
}

Json spans_to_json(const std::vector<TimelineSpan>& spans) {
  Json out = Json::array();
  for (const TimelineSpan& span : spans) {
    Json args = Json::object();
    for (const auto& [key, value] : span.args) args[key] = value;
    out.push_back(Json{{"name", span.name},
                       {"start_ms", span.start_ms},
                       {"end_ms", span.end_ms},
                       {"args", std::move(args)}});
  }
  return out;
}

Result<std::vector<TimelineSpan>> spans_from_json(const Json& event) {
  const auto it = event.find("spans");
  if (it == event.end() || !it->is_array()) {
    return invalid_argument("prefill event: 'spans' must be an array");
  }
  std::vector<TimelineSpan> spans;
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& entry = (*it)[i];
    const std::string where = "prefill event: spans[" + std::to_string(i) + "]";
    if (!entry.is_object()) return invalid_argument(where + " is not an object");
    FieldReader reader(entry, where);
    TimelineSpan span;
    span.name = reader.get<std::string>("name", "");
    span.start_ms = reader.get<double>("start_ms", 0);
    span.end_ms = reader.get<double>("end_ms", 0);
    PDS_RETURN_IF_ERROR(reader.status());
    if (span.name.empty()) return invalid_argument(where + ": 'name' is empty");
    if (!std::isfinite(span.start_ms) || !std::isfinite(span.end_ms) || span.start_ms < 0 ||
        span.end_ms < span.start_ms) {
      return invalid_argument(where + " ('" + span.name + "'): needs 0 <= start_ms <= end_ms");
    }
    const auto args = entry.find("args");
    if (args != entry.end()) {
      if (!args->is_object()) return invalid_argument(where + ": 'args' must be an object");
      for (const auto& [key, value] : args->items()) {
        if (!value.is_number()) {
          return invalid_argument(where + ": args." + key + " must be a number");
        }
        span.args.emplace_back(key, value.get<double>());
      }
    }
    spans.push_back(std::move(span));
  }
  return spans;
}

}  // namespace

const char* prefill_event_name(PrefillEvent::Kind kind) {
  switch (kind) {
    case PrefillEvent::Kind::kFirstToken:
      return "first_token";
    case PrefillEvent::Kind::kKvSent:
      return "kv_sent";
    case PrefillEvent::Kind::kKvFailed:
      return "kv_failed";
    case PrefillEvent::Kind::kError:
      return "error";
  }
  return "error";
}

KvBlockLayout kv_block_layout(const KvLayout& pool, std::vector<float> k_scales,
                              std::vector<float> v_scales) {
  return {pool.num_layers,
          pool.block_size,
          pool.num_kv_heads,
          pool.head_dim,
          std::string(dtype_name(pool.dtype)),
          std::move(k_scales),
          std::move(v_scales)};
}

namespace {

// The shortest text that reads back as each value.
std::string list_of(const std::vector<float>& values) {
  std::string text;
  for (const float value : values) {
    char buffer[32];
    const std::to_chars_result end = std::to_chars(buffer, buffer + sizeof buffer, value);
    text += (text.empty() ? "" : ", ") + std::string(buffer, end.ptr);
  }
  return "[" + text + "]";
}

// An optional array of positive numbers (absent: empty).
std::vector<float> read_scales(const Json& layout, const char* name, FieldReader& reader) {
  std::vector<float> scales;
  const auto it = layout.find(name);
  if (it == layout.end() || it->is_null()) return scales;
  if (!it->is_array() || it->size() > 4096) {
    reader.fail(std::string("'") + name + "' must be an array of at most 4096 numbers");
    return {};
  }
  for (const Json& value : *it) {
    if (!value.is_number() || !(value.get<double>() > 0.0)) {
      reader.fail(std::string("'") + name + "' must hold positive numbers");
      return {};
    }
    scales.push_back(value.get<float>());
  }
  return scales;
}

}  // namespace

std::string KvBlockLayout::to_string() const {
  std::string text = std::to_string(num_layers) + " layers x " + std::to_string(block_size) +
                     " tokens x " + std::to_string(num_kv_heads) + " kv heads x " +
                     std::to_string(head_dim) + " " + dtype;
  if (!k_scales.empty() || !v_scales.empty()) {
    text += " (k_scale " + list_of(k_scales) + ", v_scale " + list_of(v_scales) + ")";
  }
  return text;
}

Json prefill_work_to_json(const PrefillWork& work) {
  return Json{{"request_id", work.request_id},
              {"transfer_tag", work.transfer_tag},
              {"prompt_token_ids", work.prompt_token_ids},
              {"sampling", sampling_to_json(work.sampling)},
              {"kv",
               {{"descriptor", work.kv_descriptor},
                {"num_blocks", work.kv_num_blocks},
                {"layout",
                 {{"num_layers", work.kv_layout.num_layers},
                  {"block_size", work.kv_layout.block_size},
                  {"num_kv_heads", work.kv_layout.num_kv_heads},
                  {"head_dim", work.kv_layout.head_dim},
                  {"dtype", work.kv_layout.dtype},
                  {"k_scales", work.kv_layout.k_scales},
                  {"v_scales", work.kv_layout.v_scales}}},
                {"first_block", work.first_block},
                {"block_ids", work.block_ids},
                {"checksum", work.kv_checksum}}},
              {"timeout_ms", work.timeout_ms}};
}

nlohmann::json prefill_cancel_to_json(const PrefillCancel& cancel) {
  return Json{{"request_id", cancel.request_id}, {"transfer_tag", cancel.transfer_tag}};
}

Result<PrefillCancel> parse_prefill_cancel(std::string_view body) {
  PDS_ASSIGN_OR_RETURN(const Json json, parse_json_bounded(body, "prefill cancel"));
  if (!json.is_object()) return invalid_argument("prefill cancel: the body is not a JSON object");
  PrefillCancel cancel;
  FieldReader reader(json, "prefill cancel");
  cancel.request_id = reader.get<std::string>("request_id", "");
  cancel.transfer_tag = reader.get<uint64_t>("transfer_tag", 0);
  PDS_RETURN_IF_ERROR(reader.status());
  if (cancel.request_id.empty()) return invalid_argument("prefill cancel: 'request_id' is empty");
  return cancel;
}

nlohmann::json prefill_cancel_answer_to_json(const PrefillCancelAnswer& answer) {
  return Json{{"found", answer.found}, {"settled", answer.settled}};
}

Result<PrefillCancelAnswer> parse_prefill_cancel_answer(std::string_view body) {
  PDS_ASSIGN_OR_RETURN(const Json json, parse_json_bounded(body, "prefill cancel answer"));
  if (!json.is_object()) {
    return invalid_argument("prefill cancel answer: the body is not a JSON object");
  }
  PrefillCancelAnswer answer;
  FieldReader reader(json, "prefill cancel answer");
  answer.found = reader.get<bool>("found", false);
  answer.settled = reader.get<bool>("settled", false, /*required=*/false);
  PDS_RETURN_IF_ERROR(reader.status());
  return answer;
}

Result<PrefillWork> parse_prefill_work(std::string_view body) {
  PDS_ASSIGN_OR_RETURN(const Json json, parse_json_bounded(body, "prefill work"));
  if (!json.is_object()) return invalid_argument("prefill work: the body is not a JSON object");
  PrefillWork work;
  FieldReader reader(json, "prefill work");
  work.request_id = reader.get<std::string>("request_id", "");
  work.transfer_tag = reader.get<uint64_t>("transfer_tag", 0);
  work.prompt_token_ids = reader.get_ids("prompt_token_ids");
  work.timeout_ms = reader.get<int64_t>("timeout_ms", 0);
  if (const Json* sampling = reader.object("sampling")) {
    FieldReader sampling_reader(*sampling, "prefill work: sampling");
    work.sampling = sampling_from_json(*sampling, sampling_reader);
    PDS_RETURN_IF_ERROR(sampling_reader.status());
  }
  if (const Json* kv = reader.object("kv")) {
    FieldReader kv_reader(*kv, "prefill work: kv");
    work.kv_descriptor = kv_reader.get<std::string>("descriptor", "");
    work.kv_num_blocks = kv_reader.get<int>("num_blocks", 0);
    work.first_block = kv_reader.get<int>("first_block", 0);
    work.block_ids = kv_reader.get_ids("block_ids");
    work.kv_checksum = kv_reader.get<bool>("checksum", false, /*required=*/false);
    if (const Json* layout = kv_reader.object("layout")) {
      FieldReader layout_reader(*layout, "prefill work: kv.layout");
      work.kv_layout.num_layers = layout_reader.get<int>("num_layers", 0);
      work.kv_layout.block_size = layout_reader.get<int>("block_size", 0);
      work.kv_layout.num_kv_heads = layout_reader.get<int>("num_kv_heads", 0);
      work.kv_layout.head_dim = layout_reader.get<int>("head_dim", 0);
      work.kv_layout.dtype = layout_reader.get<std::string>("dtype", "");
      work.kv_layout.k_scales = read_scales(*layout, "k_scales", layout_reader);
      work.kv_layout.v_scales = read_scales(*layout, "v_scales", layout_reader);
      PDS_RETURN_IF_ERROR(layout_reader.status());
    }
    PDS_RETURN_IF_ERROR(kv_reader.status());
  }
  PDS_RETURN_IF_ERROR(reader.status());
  if (work.request_id.empty()) return invalid_argument("prefill work: 'request_id' is empty");
  if (work.prompt_token_ids.empty()) {
    return invalid_argument("prefill work: 'prompt_token_ids' is empty");
  }
  if (work.timeout_ms < 1) return invalid_argument("prefill work: 'timeout_ms' must be >= 1");
  const KvBlockLayout& layout = work.kv_layout;
  if (layout.block_size < 1 || layout.num_layers < 1 || layout.num_kv_heads < 1 ||
      layout.head_dim < 1) {
    return invalid_argument("prefill work: kv.layout must have positive sizes");
  }
  const int64_t prompt_blocks =
      (static_cast<int64_t>(work.prompt_token_ids.size()) + layout.block_size - 1) /
      layout.block_size;
  if (work.first_block < 0 || work.first_block >= prompt_blocks) {
    return invalid_argument("prefill work: kv.first_block " + std::to_string(work.first_block) +
                            " is outside the prompt's " + std::to_string(prompt_blocks) +
                            " blocks");
  }
  if (static_cast<int64_t>(work.block_ids.size()) != prompt_blocks - work.first_block) {
    return invalid_argument("prefill work: kv.block_ids has " +
                            std::to_string(work.block_ids.size()) + " blocks, the prompt needs " +
                            std::to_string(prompt_blocks - work.first_block));
  }
  for (int32_t block : work.block_ids) {
    if (block >= work.kv_num_blocks) {
      return invalid_argument("prefill work: kv block " + std::to_string(block) +
                              " is outside the decode pool's " +
                              std::to_string(work.kv_num_blocks) + " blocks");
    }
  }
  return work;
}

std::string prefill_event_line(const PrefillEvent& event) {
  Json json{{"event", prefill_event_name(event.kind)}};
  switch (event.kind) {
    case PrefillEvent::Kind::kFirstToken: {
      json["token"] = event.token;
      if (event.logprob) json["logprob"] = *event.logprob;
      Json top = Json::array();
      for (const TokenLogprob& entry : event.top_logprobs) {
        top.push_back(Json::array({entry.token, entry.logprob}));
      }
      json["top_logprobs"] = std::move(top);
      if (event.prompt_logprobs)
        json["prompt_logprobs"] = prompt_logprobs_to_json(*event.prompt_logprobs);
      json["rng_state"] = event.rng_state;
      json["cached_tokens"] = event.cached_tokens;
      json["queue_ms"] = event.queue_ms;
      json["compute_ms"] = event.compute_ms;
      json["head_sent_ms"] = event.head_sent_ms;
      json["spans"] = spans_to_json(event.spans);
      break;
    }
    case PrefillEvent::Kind::kKvSent:
      json["bytes"] = event.bytes;
      json["blocks"] = event.blocks;
      json["transfer_ms"] = event.transfer_ms;
      json["layers"] = event.layers;
      json["layers_overlapped"] = event.layers_overlapped;
      if (!event.block_checksums.empty()) json["block_checksums"] = event.block_checksums;
      json["spans"] = spans_to_json(event.spans);
      break;
    case PrefillEvent::Kind::kKvFailed:
    case PrefillEvent::Kind::kError:
      json["error"] = event.error;
      break;
  }
  return json.dump() + "\n";
}

Result<PrefillEvent> parse_prefill_event(std::string_view line) {
  Result<Json> parsed = parse_json_bounded(line, "prefill event");
  if (!parsed.ok() || !parsed->is_object()) {
    const std::string problem =
        parsed.ok() ? "prefill event: not a JSON object" : parsed.status().message();
    return invalid_argument(problem + ": " + std::string(line.substr(0, 200)));
  }
  const Json& json = *parsed;
  FieldReader reader(json, "prefill event");
  const std::string name = reader.get<std::string>("event", "");
  PDS_RETURN_IF_ERROR(reader.status());
  PrefillEvent event;
  if (name == "first_token") {
    event.kind = PrefillEvent::Kind::kFirstToken;
    event.token = reader.get<int32_t>("token", 0);
    if (json.contains("logprob")) event.logprob = reader.get<float>("logprob", 0.0f);
    event.cached_tokens = reader.get<int>("cached_tokens", 0);
    event.queue_ms = reader.get<double>("queue_ms", 0);
    event.compute_ms = reader.get<double>("compute_ms", 0);
    event.head_sent_ms = reader.get<double>("head_sent_ms", 0);
    reader.get_u64s("rng_state", event.rng_state);
    PDS_RETURN_IF_ERROR(reader.status());
    if (!std::isfinite(event.head_sent_ms) || event.head_sent_ms < 0) {
      return invalid_argument("prefill event: 'head_sent_ms' must be a finite number >= 0");
    }
    PDS_ASSIGN_OR_RETURN(event.spans, spans_from_json(json));
    const auto top = json.find("top_logprobs");
    if (top != json.end()) {
      if (!top->is_array()) return invalid_argument("prefill event: 'top_logprobs' is no array");
      for (const Json& entry : *top) {
        if (!entry.is_array() || entry.size() != 2 || !entry[0].is_number_integer() ||
            !entry[1].is_number()) {
          return invalid_argument("prefill event: 'top_logprobs' entries are [token, logprob]");
        }
        event.top_logprobs.push_back({entry[0].get<int32_t>(), entry[1].get<float>()});
      }
    }
    if (const auto prompt = json.find("prompt_logprobs"); prompt != json.end()) {
      PDS_ASSIGN_OR_RETURN(event.prompt_logprobs, prompt_logprobs_from_json(*prompt));
    }
  } else if (name == "kv_sent") {
    event.kind = PrefillEvent::Kind::kKvSent;
    event.bytes = reader.get<uint64_t>("bytes", 0);
    event.blocks = reader.get<int>("blocks", 0);
    event.transfer_ms = reader.get<double>("transfer_ms", 0);
    event.layers = reader.get<int>("layers", 0);
    event.layers_overlapped = reader.get<int>("layers_overlapped", 0);
    PDS_RETURN_IF_ERROR(reader.status());
    if (event.layers < 0 || event.layers_overlapped < 0 || event.layers_overlapped > event.layers) {
      return invalid_argument("prefill event: needs 0 <= 'layers_overlapped' <= 'layers'");
    }
    if (const auto sums = json.find("block_checksums"); sums != json.end()) {
      if (!sums->is_array()) return invalid_argument("prefill event: 'block_checksums' is no array");
      for (const Json& sum : *sums) {
        if (!sum.is_number_unsigned()) {
          return invalid_argument("prefill event: 'block_checksums' must hold unsigned integers");
        }
        event.block_checksums.push_back(sum.get<uint64_t>());
      }
    }
    PDS_ASSIGN_OR_RETURN(event.spans, spans_from_json(json));
  } else if (name == "kv_failed" || name == "error") {
    event.kind = name == "error" ? PrefillEvent::Kind::kError : PrefillEvent::Kind::kKvFailed;
    event.error = reader.get<std::string>("error", "");
  } else {
    return invalid_argument("prefill event: unknown event '" + name + "'");
  }
  PDS_RETURN_IF_ERROR(reader.status());
  return event;
}

}  // namespace pdserve
