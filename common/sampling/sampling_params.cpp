#include "common/sampling/sampling_params.h"

#include <cmath>
#include <set>
#include <string>

namespace pdserve {
namespace {

Status out_of_range_parameter(const char* name, const std::string& value,
                              const std::string& allowed) {
  return invalid_argument(std::string("sampling parameter ") + name + " = " + value +
                          " is out of range (allowed: " + allowed + ")");
}

std::string text(float value) {
  if (std::isnan(value)) return "nan";
  std::string result = std::to_string(value);
  // std::to_string prints six decimals; trim trailing zeros so messages echo the input.
  result.erase(result.find_last_not_of('0') + 1);
  if (!result.empty() && result.back() == '.') result.pop_back();
  return result;
}

}  // namespace

Status SamplingParams::validate(int vocab_size) const {
  if (vocab_size <= 0) {
    return invalid_argument("vocabulary size must be positive, got " + std::to_string(vocab_size));
  }
  // Each test is written so that NaN fails it.
  if (!(temperature >= 0.0f && std::isfinite(temperature))) {
    return out_of_range_parameter("temperature", text(temperature), "a finite number >= 0");
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return out_of_range_parameter("top_p", text(top_p), "(0, 1]");
  }
  if (top_k < -1) {
    return out_of_range_parameter("top_k", std::to_string(top_k), "-1, 0 (disabled) or >= 1");
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return out_of_range_parameter("min_p", text(min_p), "[0, 1]");
  }
  if (!(repetition_penalty > 0.0f && std::isfinite(repetition_penalty))) {
    return out_of_range_parameter("repetition_penalty", text(repetition_penalty),
                                  "a finite number > 0");
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return out_of_range_parameter("presence_penalty", text(presence_penalty), "[-2, 2]");
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return out_of_range_parameter("frequency_penalty", text(frequency_penalty), "[-2, 2]");
  }
  if (logprobs < 0 || logprobs > kMaxLogprobs) {
    return out_of_range_parameter("logprobs", std::to_string(logprobs), "[0, 20]");
  }
  if (prompt_logprobs && (*prompt_logprobs < 0 || *prompt_logprobs > kMaxLogprobs)) {
    return out_of_range_parameter("prompt_logprobs", std::to_string(*prompt_logprobs), "[0, 20]");
  }
  if (max_tokens < 1) {
    return out_of_range_parameter("max_tokens", std::to_string(max_tokens), ">= 1");
  }
  if (min_tokens < 0 || min_tokens > max_tokens) {
    return out_of_range_parameter("min_tokens", std::to_string(min_tokens),
                                  "[0, max_tokens = " + std::to_string(max_tokens) + "]");
  }
  for (const auto& [name, ids] : {std::pair{"stop_token_ids", &stop_token_ids},
                                  std::pair{"scripted_output", &scripted_output}}) {
    for (size_t i = 0; i < ids->size(); ++i) {
      int32_t id = (*ids)[i];
      if (id < 0 || id >= vocab_size) {
        return invalid_argument(std::string("sampling parameter ") + name + "[" +
                                std::to_string(i) + "] = " + std::to_string(id) +
                                " is outside the vocabulary [0, " + std::to_string(vocab_size) +
                                ")");
      }
    }
  }
  std::set<int32_t> biased;
  for (const LogitBias& entry : logit_bias) {
    const std::string name = "logit_bias[" + std::to_string(entry.token) + "]";
    if (entry.token < 0 || entry.token >= vocab_size) {
      return invalid_argument("sampling parameter " + name +
                              ": token id outside the vocabulary [0, " +
                              std::to_string(vocab_size) + ")");
    }
    if (!biased.insert(entry.token).second) {
      return invalid_argument("sampling parameter " + name + " is given twice");
    }
    if (!(entry.bias >= -kMaxLogitBias && entry.bias <= kMaxLogitBias)) {
      return out_of_range_parameter(name.c_str(), text(entry.bias), "[-100, 100]");
    }
  }
  if (structured_output) {
    if (structured_output->spec.empty()) {
      return invalid_argument("sampling parameter structured_output has an empty spec");
    }
    if (ignore_eos) {
      return invalid_argument("ignore_eos cannot be combined with a structured output");
    }
    if (min_tokens > 0) {
      return invalid_argument("min_tokens cannot be combined with a structured output");
    }
  }
  return {};
}

const char* structured_output_kind_name(StructuredOutput::Kind kind) {
  switch (kind) {
    case StructuredOutput::Kind::kJsonSchema:
      return "json_schema";
    case StructuredOutput::Kind::kRegex:
      return "regex";
    case StructuredOutput::Kind::kGrammar:
      return "grammar";
    case StructuredOutput::Kind::kToolCalls:
      return "tool_calls";
  }
  return "unknown";
}

std::optional<StructuredOutput::Kind> parse_structured_output_kind(const std::string& name) {
  for (const auto kind : {StructuredOutput::Kind::kJsonSchema, StructuredOutput::Kind::kRegex,
                          StructuredOutput::Kind::kGrammar, StructuredOutput::Kind::kToolCalls}) {
    if (name == structured_output_kind_name(kind)) return kind;
  }
  return std::nullopt;
}

SamplingParams resolve_sampling_defaults(SamplingParams base, const SamplingDefaults& request,
                                         const SamplingDefaults& generation_config) {
  const SamplingParams built_in;
  auto pick = [](const auto& requested, const auto& from_model, auto fallback) {
    if (requested) return *requested;
    if (from_model) return *from_model;
    return fallback;
  };
  base.temperature = pick(request.temperature, generation_config.temperature, built_in.temperature);
  base.top_p = pick(request.top_p, generation_config.top_p, built_in.top_p);
  base.top_k = pick(request.top_k, generation_config.top_k, built_in.top_k);
  base.min_p = pick(request.min_p, generation_config.min_p, built_in.min_p);
  base.repetition_penalty = pick(request.repetition_penalty, generation_config.repetition_penalty,
                                 built_in.repetition_penalty);
  return base;
}

}  // namespace pdserve
