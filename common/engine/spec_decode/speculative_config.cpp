#include "common/engine/spec_decode/speculative_config.h"

#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

namespace pdserve {
namespace {

constexpr std::string_view kWhere = "--speculative-config: ";

Status bad(const std::string& message) {
  return invalid_argument(std::string(kWhere) + message);
}

Result<std::optional<int>> optional_int(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::optional<int>();
  if (!it->is_number_integer() || it->get<int64_t>() < -1'000'000 ||
      it->get<int64_t>() > 1'000'000) {
    return bad(std::string("'") + key + "' must be an integer, got " + it->dump());
  }
  return std::optional<int>(it->get<int>());
}

Result<std::optional<std::string>> optional_string(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string())
    return bad(std::string("'") + key + "' must be a string, got " + it->dump());
  return std::optional<std::string>(it->get<std::string>());
}

}  // namespace

std::string_view speculative_method_name(SpeculativeMethod method) {
  switch (method) {
    case SpeculativeMethod::kNgram:
      return "ngram";
    case SpeculativeMethod::kDraftModel:
      return "draft_model";
  }
  return "unknown";
}

Result<SpeculativeConfig> parse_speculative_config(std::string_view json) {
  const nlohmann::json object = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (object.is_discarded()) return bad("not valid JSON: " + std::string(json));
  if (!object.is_object()) return bad("must be a JSON object, got " + object.dump());
  static const std::set<std::string> kKeys = {"method", "num_speculative_tokens", "model",
                                              "prompt_lookup_min", "prompt_lookup_max"};
  for (const auto& [key, value] : object.items()) {
    if (!kKeys.contains(key)) {
      return bad("unknown key '" + key +
                 "' (known: method, num_speculative_tokens, model, prompt_lookup_min, "
                 "prompt_lookup_max)");
    }
  }
  PDS_ASSIGN_OR_RETURN(std::optional<std::string> method, optional_string(object, "method"));
  PDS_ASSIGN_OR_RETURN(std::optional<std::string> model, optional_string(object, "model"));
  PDS_ASSIGN_OR_RETURN(std::optional<int> k, optional_int(object, "num_speculative_tokens"));
  PDS_ASSIGN_OR_RETURN(std::optional<int> lookup_min, optional_int(object, "prompt_lookup_min"));
  PDS_ASSIGN_OR_RETURN(std::optional<int> lookup_max, optional_int(object, "prompt_lookup_max"));

  SpeculativeConfig config;
  if (!method) {
    // vLLM infers a draft model from "model"; without either there is nothing to run.
    if (!model) return bad("set 'method' (\"ngram\" or \"draft_model\") or a draft 'model'");
    config.method = SpeculativeMethod::kDraftModel;
  } else if (*method == "ngram") {
    config.method = SpeculativeMethod::kNgram;
  } else if (*method == "draft_model") {
    config.method = SpeculativeMethod::kDraftModel;
  } else {
    return bad("'method' must be \"ngram\" or \"draft_model\", got \"" + *method + "\"");
  }
  if (!k) return bad("'num_speculative_tokens' is required");
  if (*k < 1 || *k > kMaxSpeculativeTokens) {
    return bad("'num_speculative_tokens' must be in [1, " + std::to_string(kMaxSpeculativeTokens) +
               "], got " + std::to_string(*k));
  }
  config.num_speculative_tokens = *k;

  if (config.method == SpeculativeMethod::kDraftModel) {
    if (!model || model->empty()) return bad("method \"draft_model\" needs a draft 'model'");
    if (lookup_min || lookup_max) {
      return bad("'prompt_lookup_min'/'prompt_lookup_max' apply to method \"ngram\" only");
    }
    config.model = *model;
    return config;
  }
  if (model) return bad("method \"ngram\" takes no 'model'");
  // vLLM's defaults: 5 and 5 when neither is set; one set gives the other its value.
  config.prompt_lookup_min = lookup_min.value_or(lookup_max.value_or(5));
  config.prompt_lookup_max = lookup_max.value_or(lookup_min.value_or(5));
  if (config.prompt_lookup_min < 1) {
    return bad("'prompt_lookup_min' must be >= 1, got " + std::to_string(config.prompt_lookup_min));
  }
  if (config.prompt_lookup_max < config.prompt_lookup_min) {
    return bad("'prompt_lookup_max' (" + std::to_string(config.prompt_lookup_max) +
               ") must be >= 'prompt_lookup_min' (" + std::to_string(config.prompt_lookup_min) +
               ")");
  }
  return config;
}

}  // namespace pdserve
