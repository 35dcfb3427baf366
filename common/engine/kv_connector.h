// How a disaggregated node moves KV in and out of its engine's paged pool, behind an interface
// so that common/ stays free of UCX (the implementations live in kv_transfer/).
//
// Prefill side (export), layer by layer: before the forward of the step that completes the
// prompt of a request marked with `kv_export`, the engine pins the request's blocks and calls
// start_export(); during that forward, layer_written(l) says layer l's KV of every such prompt
// is written (the connector may start its puts while the next layers compute); after the
// forward and the first token, finish_export() (the rest of the puts, then the completion
// message) or, when the forward or the sampling failed, abort_export(). The connector later
// reports kExportReleased, after which the engine unpins the blocks (so a block is never
// reused while a put may still read it).
//
// Decode side (import): a request marked with `kv_import` gets its blocks at once (refused
// with ResourceExhausted when the pool is full, so the router can try another node), reusing
// the local prefix cache; the engine pins them and calls start_import() with the blocks whose
// KV must arrive. The connector reports kFirstToken as soon as the prefill node has sampled
// the first token (the engine streams it at once: the client's TTFT does not include the
// transfer), then kImportReady (the KV has landed; the sequence joins the decode batch) or
// kImportFailed, and kImportReleased once no remote write into those blocks can still happen
// (it may come later than a failure: a lost sender's puts could still be in flight until its
// deadline). Only then does the engine unpin. A first token that ends the request (EOS,
// max_tokens 1, a stop string) makes the engine call cancel_import().
//
// All methods are called on the engine thread; events are collected with poll(). The
// connector calls the wakeup function (from any thread) when it has new events.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/core/status.h"
#include "common/engine/inference_service.h"
#include "common/engine/remote_kv.h"
#include "common/sampling/sampler_rng.h"

namespace pdserve {

// The remotely computed part of an imported request.
struct RemotePrefillResult {
  int32_t first_token = 0;
  std::optional<SampledTokenLogprobs> first_logprobs;
  // Requests with prompt_logprobs: the prefill node's, one per prompt token after the first.
  std::optional<std::vector<PromptTokenLogprob>> prompt_logprobs;
  SamplerRng::State rng_state{};  // the sampler's state after the first token
  RemotePrefillStats stats;       // as known at the first token (no transfer figures yet)
};

enum class KvEventKind {
  kExportReleased,
  kFirstToken,
  kImportReady,
  kImportFailed,
  kImportReleased
};

struct KvEvent {
  KvEventKind kind = KvEventKind::kImportReady;
  std::string request_id;
  // kImportFailed: why. kImportReleased: OK, or DeadlineExceeded when the blocks were held
  // until the hold deadline because nothing confirmed that no put could land.
  Status status;
  std::optional<RemotePrefillResult> result;  // kFirstToken
  // kImportReady: the whole remote prefill's figures, the transfer's included; kImportFailed:
  // only checksum_mismatches, when there were some.
  std::optional<RemotePrefillStats> stats;
};

class KvConnector {
 public:
  virtual ~KvConnector() = default;

  // The engine's wakeup; called once before any other method.
  virtual void set_wakeup(std::function<void()> wakeup) = 0;

  // Prefill side. `block_table` covers the whole prompt (num_prompt_tokens tokens). An error
  // means nothing was started (no kExportReleased follows).
  virtual Status start_export(const std::string& request_id, const KvExportTarget& target,
                              std::span<const int32_t> block_table, int num_prompt_tokens) = 0;
  // Layer `layer` (in order, from 0) of every started, unfinished export is written.
  virtual void layer_written(int layer) = 0;
  virtual void finish_export(const std::string& request_id) = 0;
  // The KV will not be complete: no completion message; the receiver must not use it.
  virtual void abort_export(const std::string& request_id) = 0;

  // Decode side. The request's blocks are `block_table`; the first `num_cached_tokens` prompt
  // tokens (whole blocks) are already in the pool.
  virtual Status start_import(const InferenceRequest& request, std::span<const int32_t> block_table,
                              int num_cached_tokens) = 0;
  // The request is no longer wanted (its client left); the connector may stop early but must
  // still report kImportReleased.
  virtual void cancel_import(const std::string& request_id) = 0;

  // Events since the previous call, in order.
  virtual std::vector<KvEvent> poll() = 0;
};

}  // namespace pdserve
