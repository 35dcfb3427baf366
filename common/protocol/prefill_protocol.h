// The internal protocol between a decode node and a prefill node (disaggregation).
//
// The decode node POSTs a PrefillWork as JSON to the prefill node's /internal/v1/prefill
// (with the cluster token). The prefill node answers 200 with a stream of newline-delimited
// JSON events: first `first_token` (as soon as it is sampled: the request's TTFT does not wait
// for the transfer), then `kv_sent` or `kv_failed`; or a single `error` event when the prefill
// itself failed. A non-200 answer is an OpenAI-style error body. A decode node that no longer
// wants the work POSTs a PrefillCancel to /internal/v1/prefill/cancel (below).
//
// Timeline (see the shared timeline format): `first_token` carries the prefill node's spans up
// to the token (prefill.queue, prefill.chunk...) and `head_sent_ms`, `kv_sent` the kv.transfer
// and prefill.request spans; all in ms after the prefill node's receipt of the work, which the
// decode node aligns to its own clock.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/core/kv_layout.h"
#include "common/core/status.h"
#include "common/engine/remote_kv.h"
#include "common/sampling/prompt_logprobs.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampler_rng.h"
#include "common/sampling/sampling_params.h"

namespace pdserve {

// The geometry both pools must share for a block to mean the same bytes on both sides.
struct KvBlockLayout {
  int num_layers = 0;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  std::string dtype;  // "bfloat16", "float32", "float8_e4m3fn"
  // An FP8 pool's per-layer k_scale / v_scale (empty: 1.0 everywhere): blocks quantized with
  // other scales hold other values.
  std::vector<float> k_scales = {};
  std::vector<float> v_scales = {};

  bool operator==(const KvBlockLayout&) const = default;
  std::string to_string() const;
};

// The wire form of a pool's blocks (its size travels apart, as kv.num_blocks) and its scales.
KvBlockLayout kv_block_layout(const KvLayout& pool, std::vector<float> k_scales = {},
                              std::vector<float> v_scales = {});

struct PrefillWork {
  std::string request_id;
  uint64_t transfer_tag = 0;
  std::vector<int32_t> prompt_token_ids;
  SamplingParams sampling;    // as the decode node resolved it (max_tokens is the request's)
  std::string kv_descriptor;  // the decode node's transfer descriptor, base64
  int kv_num_blocks = 0;      // the decode pool's size in blocks
  KvBlockLayout kv_layout;
  int first_block = 0;             // prompt blocks before it are already on the decode node
  std::vector<int32_t> block_ids;  // decode-node blocks for prompt blocks first_block..
  int64_t timeout_ms = 30'000;     // for the transfer
  bool kv_checksum = false;        // send a checksum of each block with kv_sent
};

nlohmann::json prefill_work_to_json(const PrefillWork& work);
// InvalidArgument naming the field that is missing, mistyped or out of range.
Result<PrefillWork> parse_prefill_work(std::string_view body);

// POST /internal/v1/prefill/cancel (cluster token): the decode node no longer wants the work
// of this request and transfer tag (its client left, or it gave up). The prefill node aborts
// that work only, and answers on the work's event stream: an `error` event when the prefill
// had not exported yet, `kv_failed` once the export's issued puts are complete (no put can land
// any more), or `kv_sent` when the transfer had already finished. For work not (yet) there,
// the prefill node remembers the pair for a while and refuses that work if it arrives later
// (409). The cancel call itself answers 200 with a PrefillCancelAnswer once no put of that
// work can land any more, so that a decode node whose work call is already closed (the cancel
// raced the work's send) still hears it.
struct PrefillCancel {
  std::string request_id;
  uint64_t transfer_tag = 0;
};

nlohmann::json prefill_cancel_to_json(const PrefillCancel& cancel);
// InvalidArgument naming the field that is missing or mistyped.
Result<PrefillCancel> parse_prefill_cancel(std::string_view body);

struct PrefillCancelAnswer {
  bool found = false;  // the work was running on this node
  // No put of the work can land any more: it has ended, or it never ran here and will be
  // refused. Older prefill nodes answer at once without it (false): not a confirmation.
  bool settled = false;
};

nlohmann::json prefill_cancel_answer_to_json(const PrefillCancelAnswer& answer);
// InvalidArgument when `found` is missing or a field is mistyped.
Result<PrefillCancelAnswer> parse_prefill_cancel_answer(std::string_view body);

struct PrefillEvent {
  enum class Kind { kFirstToken, kKvSent, kKvFailed, kError };
  Kind kind = Kind::kError;
  // kFirstToken
  int32_t token = 0;
  std::optional<float> logprob;  // when logprobs were requested
  std::vector<TokenLogprob> top_logprobs;
  // When the work's sampling asked for prompt_logprobs: one per prompt token after the first,
  // on the wire [[token, logprob, rank, [[token, logprob], ...]], ...] (about 30 bytes per
  // position plus 25 per alternative: a 4k-token prompt with 5 alternatives adds ~0.6 MB).
  std::optional<std::vector<PromptTokenLogprob>> prompt_logprobs;
  SamplerRng::State rng_state{};
  int cached_tokens = 0;
  double queue_ms = 0;
  double compute_ms = 0;
  double head_sent_ms = 0;  // the answer's head went out, ms after the receipt of the work
  // kKvSent
  uint64_t bytes = 0;
  int blocks = 0;
  double transfer_ms = 0;
  int layers = 0;
  int layers_overlapped = 0;
  // When the work asked for them: XXH3-64 of each sent block (kv_transfer/kv_checksum.h).
  std::vector<uint64_t> block_checksums;
  // kFirstToken, kKvSent: ms after the receipt of the work, each with end_ms >= start_ms >= 0
  std::vector<TimelineSpan> spans;
  // kKvFailed, kError
  std::string error;
};

// The event's wire name: "first_token", "kv_sent", "kv_failed" or "error".
const char* prefill_event_name(PrefillEvent::Kind kind);
// One line, ending with '\n'.
std::string prefill_event_line(const PrefillEvent& event);
// One line without its '\n'. InvalidArgument for anything malformed.
Result<PrefillEvent> parse_prefill_event(std::string_view line);

}  // namespace pdserve
