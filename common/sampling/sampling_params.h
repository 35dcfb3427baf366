// Per-request sampling parameters (the OpenAI / vLLM request fields), their validation, and
// how unset values fall back to a model's generation_config.json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/core/status.h"

namespace pdserve {

inline constexpr float kMaxLogitBias = 100.0f;

struct LogitBias {
  int32_t token = 0;
  float bias = 0.0f;
  bool operator==(const LogitBias&) const = default;
};

// A constraint on the output, enforced token by token during sampling (common/grammar/): the
// structured outputs of the OpenAI API and vLLM, and forced tool calls. JSON comes out compact
// (", " and ": " separators, no other whitespace), so a bounded schema always finishes.
struct StructuredOutput {
  enum class Kind : uint8_t {
    kJsonSchema,  // spec: a JSON Schema
    kRegex,       // spec: a regular expression the whole output matches
    kGrammar,     // spec: an EBNF grammar (xgrammar's GBNF dialect, root rule "root")
    // spec: {"tools": [{"name": ..., "parameters": {schema}}, ...], "multiple": bool}: Qwen3's
    // hermes tool calls, "<tool_call>\n{"name": "<a tool>", "arguments": <its parameters>}
    // \n</tool_call>", one, or with "multiple" one or more separated by "\n".
    kToolCalls,
  };
  Kind kind = Kind::kJsonSchema;
  std::string spec;

  friend bool operator==(const StructuredOutput&, const StructuredOutput&) = default;
};

// The names of StructuredOutput::Kind on the wire (the prefill protocol): "json_schema",
// "regex", "grammar", "tool_calls".
const char* structured_output_kind_name(StructuredOutput::Kind kind);
std::optional<StructuredOutput::Kind> parse_structured_output_kind(const std::string& name);

struct SamplingParams {
  // Below kGreedyTemperature the sampler takes the argmax (see sampler.h).
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;  // 0 or -1: disabled
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::optional<uint64_t> seed;
  int logprobs = 0;  // top-N alternatives; 0: only the sampled token's logprob when want_logprobs
  bool want_logprobs = false;
  // vLLM's prompt_logprobs: the logprob of every prompt token after the first under the
  // logits of the position before it, with this many top alternatives (0: only the token's).
  // Set: the request computes logits at every prompt position and bypasses the prefix cache.
  std::optional<int> prompt_logprobs;
  int max_tokens = 16;
  int min_tokens = 0;
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;
  // OpenAI's logit_bias: added to the token's logit before penalties and sampling; ids are
  // distinct, biases finite and in [-kMaxLogitBias, kMaxLogitBias].
  std::vector<LogitBias> logit_bias;
  // Test only (PDSERVE_TEST_SCRIPTED_OUTPUT, decode_node/README.md): output token k is
  // scripted_output[k] while k is below its size, whatever the logits; sampling goes on after.
  // Drives the whole serving path to known text with a model of random weights.
  std::vector<int32_t> scripted_output;
  std::optional<StructuredOutput> structured_output;

  // InvalidArgument naming the first parameter out of range: a negative or non-finite
  // temperature, top_p outside (0, 1], top_k < -1, min_p outside [0, 1], a repetition_penalty
  // that is not a positive finite number, presence/frequency penalties outside [-2, 2],
  // logprobs or prompt_logprobs outside [0, 20], max_tokens < 1, min_tokens outside [0,
  // max_tokens], a stop or scripted token id outside [0, vocab_size), a logit_bias entry whose id
  // is outside it, repeated, or whose bias is out of range, or a structured_output with an empty
  // spec, with ignore_eos or with min_tokens (the grammar decides when the output may end).
  Status validate(int vocab_size) const;
};

inline constexpr int kMaxLogprobs = 20;

// Sampling values that a request may leave unset (JSON null or absent) and that a model's
// generation_config.json may provide (read by the model library's GenerationConfig).
struct SamplingDefaults {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int> top_k;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
};

// vLLM's rule for each value in SamplingDefaults: the request's value when set, otherwise the
// model's generation_config value when set, otherwise SamplingParams' built-in default. Every
// other field is taken from `base`.
SamplingParams resolve_sampling_defaults(SamplingParams base, const SamplingDefaults& request,
                                         const SamplingDefaults& generation_config);

}  // namespace pdserve
