// The InferenceService calls the API server needs, in types that do not pull in
// common/sampling/sampler.h. Why: sampler.h and common/protocol/openai_response.h both define
// pdserve::TokenLogprob (with different members), so no translation unit can include both;
// only engine_bridge.cpp sees the engine's types. Remove once one of them is renamed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/core/status.h"
#include "common/sampling/sampling_params.h"
#include "common/sampling/stop_checker.h"

namespace pdserve {

class InferenceService;

struct EngineSubmission {
  std::string id;
  std::vector<int32_t> prompt_tokens;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
};

struct EngineDelta {
  std::string text;  // new text since the previous delta
  size_t new_tokens = 0;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  Status error;  // non-OK on a failed final delta
  int prompt_tokens = 0;
  int completion_tokens = 0;
  // On the final delta, from the engine's timestamps; negative when unknown.
  double time_to_first_token_s = -1.0;
  double e2e_latency_s = -1.0;
};

struct EngineModel {
  std::string name;
  int max_model_len = 0;
  int vocab_size = 0;
  SamplingDefaults generation_defaults;
};

struct EngineLoad {
  int num_waiting = 0;
  int num_running = 0;
  double kv_usage = 0.0;  // used / total blocks
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  int64_t prompt_tokens_total = 0;
  int64_t generation_tokens_total = 0;
};

// The sink runs on the engine's thread and must not block.
Status submit_to_engine(InferenceService& service, EngineSubmission submission,
                        std::function<void(EngineDelta)> sink);
void abort_in_engine(InferenceService& service, const std::string& id);
EngineModel engine_model(const InferenceService& service);
EngineLoad engine_load(const InferenceService& service);

}  // namespace pdserve
