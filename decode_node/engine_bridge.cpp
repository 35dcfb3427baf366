#include "decode_node/engine_bridge.h"

#include <utility>

#include "common/engine/inference_service.h"

namespace pdserve {

Status submit_to_engine(InferenceService& service, EngineSubmission submission,
                        std::function<void(EngineDelta)> sink) {
  InferenceRequest request;
  request.id = std::move(submission.id);
  request.prompt_tokens = std::move(submission.prompt_tokens);
  request.sampling = std::move(submission.sampling);
  request.stop = std::move(submission.stop);
  request.include_stop_str_in_output = submission.include_stop_str_in_output;
  request.skip_special_tokens = submission.skip_special_tokens;
  return service.submit(std::move(request), [sink = std::move(sink)](SequenceDelta delta) {
    EngineDelta out;
    out.text = std::move(delta.text);
    out.new_tokens = delta.token_ids.size();
    out.finished = delta.finished;
    out.finish_reason = delta.finish_reason;
    out.error = std::move(delta.error);
    out.prompt_tokens = delta.prompt_tokens;
    out.completion_tokens = delta.completion_tokens;
    const RequestTimings& t = delta.timings;
    if (delta.finished && t.first_token) {
      out.time_to_first_token_s = std::chrono::duration<double>(*t.first_token - t.arrival).count();
    }
    if (delta.finished && t.finished) {
      out.e2e_latency_s = std::chrono::duration<double>(*t.finished - t.arrival).count();
    }
    sink(std::move(out));
  });
}

void abort_in_engine(InferenceService& service, const std::string& id) {
  service.abort(id);
}

EngineModel engine_model(const InferenceService& service) {
  const ModelInfo& info = service.model_info();
  return {info.name, info.max_model_len, info.vocab_size, info.generation_defaults};
}

EngineLoad engine_load(const InferenceService& service) {
  const ServiceStats stats = service.stats();
  EngineLoad load;
  load.num_waiting = stats.num_waiting;
  load.num_running = stats.num_running;
  load.kv_usage = stats.kv_blocks_total > 0
                      ? static_cast<double>(stats.kv_blocks_used) / stats.kv_blocks_total
                      : 0.0;
  load.prefix_cache_queries = stats.prefix_cache_queried_tokens;
  load.prefix_cache_hits = stats.prefix_cache_hit_tokens;
  load.prompt_tokens_total = stats.prompt_tokens_total;
  load.generation_tokens_total = stats.generation_tokens_total;
  return load;
}

}  // namespace pdserve
