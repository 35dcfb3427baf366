// The contract between a serving front end (the decode node's OpenAI server, the prefill node's
// PrefillWork server) and an engine that runs requests. A request is one sequence (one choice
// of one prompt): the front end fans `n` and prompt lists out into several requests, which
// share the prompt's KV blocks through the prefix cache.
//
// Threading: submit/abort/stats may be called from any thread. Deltas are delivered by
// calling the request's sink on the engine's thread; a sink must return quickly and never
// block (post the delta to the connection's executor). Every accepted request receives
// exactly one final delta (finished or error), whatever happens: abort, shutdown, failure.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/core/status.h"
#include "common/engine/kv_tier.h"
#include "common/engine/remote_kv.h"
#include "common/grammar/constraint.h"
#include "common/sampling/prompt_logprobs.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampler_rng.h"
#include "common/sampling/sampling_params.h"
#include "common/sampling/stop_checker.h"

namespace pdserve {

using SteadyTime = std::chrono::steady_clock::time_point;

// A stream continued on this node after the node that started it failed (the proxy's
// failover): the tokens that node generated and delivered, and its sampler's state after the
// last of them. The sequence is prefilled here over prompt + these tokens and goes on from
// there, so greedy and seeded outputs equal an uninterrupted run's.
struct ResumedOutput {
  std::vector<int32_t> output_tokens;  // non-empty, fewer than sampling.max_tokens
  SamplerRng::State sampler_state{};
};

struct InferenceRequest {
  std::string id;                      // unique among requests in flight
  std::vector<int32_t> prompt_tokens;  // non-empty
  SamplingParams sampling;             // resolved: max_tokens is final
  // sampling.structured_output compiled for the model's vocabulary: left empty, LlmEngine
  // compiles it on a grammar compile thread (cached per distinct constraint) before queueing the
  // request, and EngineCore::add (used alone) compiles it itself.
  ConstraintHandle constraint;
  std::vector<std::string> stop;       // stop strings (matched on detokenized text)
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;  // for the detokenized text
  SteadyTime arrival = std::chrono::steady_clock::now();
  // Disaggregation (see kv_connector.h); an engine without a connector refuses both.
  std::optional<KvExportTarget> kv_export;  // prefill node: send the prompt's KV there
  std::optional<KvImportSource> kv_import;  // decode node: the prompt is prefilled remotely
  std::optional<ResumedOutput> resume;       // neither of the two above
  // Every delta carries sampler_state: a stream the proxy may continue on another node.
  bool report_sampler_state = false;
};

struct SampledTokenLogprobs {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // best first; empty unless requested
};

// Speculative decoding's counters (vLLM's vllm:spec_decode_* series): verify rows, the drafts
// they checked and the drafts accepted, in all and by position (accepted_per_position[i]: how
// often draft i, 0-based, was accepted). Also one request's figures (its delta's).
struct SpecDecodeCounts {
  int64_t num_drafts = 0;
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  std::vector<int64_t> accepted_per_position;
};

// Per-request timestamps (steady clock) for latency accounting.
// One forward step that computed some of a request's prompt tokens (chunked prefill).
struct PrefillChunkTiming {
  SteadyTime start{};
  SteadyTime end{};
  int prompt_tokens = 0;  // this request's prompt tokens computed in the step
  int batch_tokens = 0;   // all tokens of the step (other requests' too)
};

// A prefix reloaded from the lower KV tiers before the rest of the prompt was computed.
struct KvReloadTiming {
  SteadyTime start{};
  SteadyTime end{};
  int host_blocks = 0;
  int disk_blocks = 0;
  int tokens = 0;  // tokens whose KV landed (0: the reload failed; they were computed)
  bool ok = false;
};

struct RequestTimings {
  SteadyTime arrival{};
  std::optional<SteadyTime> first_scheduled;  // left the waiting queue
  std::optional<SteadyTime> first_token;
  std::optional<SteadyTime> kv_ready;  // imported requests: the remote KV has landed
  std::optional<SteadyTime> finished;
  std::vector<PrefillChunkTiming> prefill_chunks;  // prompt computed here (not the cached part)
  std::optional<KvReloadTiming> kv_reload;
};

struct SequenceDelta {
  std::string request_id;
  std::vector<int32_t> token_ids;              // tokens new since the previous delta
  std::string text;                            // their text: complete UTF-8, stop strings applied
  std::vector<SampledTokenLogprobs> logprobs;  // one per new token when logprobs were requested
  // The first delta of a request with sampling.prompt_logprobs: one per prompt token after
  // the first (vLLM's first entry, null, is the front end's to add).
  std::vector<PromptTokenLogprob> prompt_logprobs;
  bool finished = false;                       // the final delta
  FinishReason finish_reason = FinishReason::kNone;
  std::string matched_stop;  // the stop string that ended it, if any
  Status error;              // non-OK on a final delta: the request failed
  int prompt_tokens = 0;
  int completion_tokens = 0;     // so far
  int cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
  RequestTimings timings;
  std::optional<RemotePrefillStats> remote_prefill;  // imported requests
  // Exported requests and report_sampler_state: the sampler's state after this delta's
  // tokens, so another node can continue the same random stream.
  std::optional<SamplerRng::State> sampler_state;
  // The first delta of a resumed request: the text of ResumedOutput::output_tokens as it was
  // streamed before (stop strings applied), for the front end to catch up on; it was already
  // delivered and is not part of `text`.
  std::optional<std::string> resumed_text;
  // The final delta of a resumed request whose delivered output had already ended (its first
  // node was cut just before the finish chunk): the client has every token and all the text;
  // only the finish is left to send.
  bool ended_before_resume = false;
  // Speculative decoding: this request's drafts so far (no accepted_per_position).
  SpecDecodeCounts spec_decode;
};

using DeltaSink = std::function<void(SequenceDelta)>;

// Gauges and counters for /metrics.
struct ServiceStats {
  int num_waiting = 0;
  int num_running = 0;
  int kv_blocks_total = 0;
  int kv_blocks_used = 0;
  int kv_blocks_cached = 0;
  int64_t prefix_cache_queried_tokens = 0;
  int64_t prefix_cache_hit_tokens = 0;
  int64_t prompt_tokens_total = 0;
  int64_t generation_tokens_total = 0;
  int64_t preemptions_total = 0;
  // Decode side of disaggregation: imported KV that failed its checksums, such KV fetched
  // again from the next prefill node, and remote prefills that failed (for that or any
  // reason) and were prefilled here instead.
  int64_t kv_checksum_mismatches_total = 0;
  int64_t kv_refetches_total = 0;
  int64_t remote_prefill_fallbacks_total = 0;
  // Resumed streams sent here with a remote prefill whose prompt and delivered tokens were
  // all cached already: nothing was imported.
  int64_t remote_prefills_served_from_cache_total = 0;
  // Reserved import blocks freed only at their hold deadline: no confirmation came that no put
  // of the prefill node could still land (a lost prefill node, or a bug: issue #34).
  int64_t kv_import_hold_expired_total = 0;
  // Set on a node that speculates (--speculative-config); "ngram" or "draft_model".
  std::string spec_decode_method;
  SpecDecodeCounts spec_decode;
  // The lower KV tiers (host memory, disk), when the node has them (kv_tier.h).
  KvTierStats kv_tiers;
};

struct ModelInfo {
  std::string name;  // the served model name (/v1/models)
  int max_model_len = 0;
  int vocab_size = 0;
  std::vector<int32_t> eos_token_ids;
  SamplingDefaults generation_defaults;
};

class InferenceService {
 public:
  virtual ~InferenceService() = default;

  // Queues a request. ResourceExhausted when the waiting queue is full (the server answers
  // 429/503 with Retry-After), InvalidArgument/OutOfRange when it can never run, Unavailable
  // after shutdown. On error the sink is never called.
  virtual Status submit(InferenceRequest request, DeltaSink sink) = 0;
  // Aborts a request (e.g. the client disconnected); its blocks are released at the next step
  // and its final delta carries FinishReason kNone and a kCancelled error. Unknown or finished
  // ids are ignored.
  virtual void abort(const std::string& request_id) = 0;
  virtual ServiceStats stats() const = 0;
  virtual const ModelInfo& model_info() const = 0;
};

}  // namespace pdserve
