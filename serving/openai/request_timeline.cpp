#include "serving/openai/request_timeline.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace pdserve {
namespace {

// Spans of one request under construction, with the decode node's name and the origin.
class SpanList {
 public:
  explicit SpanList(const RequestTimelineInput& input) : input_(input) {}

  TimelineArgs& add(std::string name, const std::string& node, double start_ms, double end_ms,
                    int index) {
    spans_.push_back({std::move(name), node, start_ms, end_ms, {{"index", int64_t{index}}}});
    return spans_.back().args;
  }
  TimelineArgs& add_here(std::string name, SteadyTime start, SteadyTime end, int index) {
    return add(std::move(name), input_.node, ms(start), ms(end), index);
  }
  double ms(SteadyTime time) const { return milliseconds_after(input_.arrival, time); }

  // In start order (ties: the longer span, its parent, first).
  std::vector<RequestTimelineSpan> take() {
    std::stable_sort(spans_.begin(), spans_.end(),
                     [](const RequestTimelineSpan& a, const RequestTimelineSpan& b) {
                       if (a.start_ms != b.start_ms) return a.start_ms < b.start_ms;
                       return a.end_ms > b.end_ms;
                     });
    return std::move(spans_);
  }

 private:
  const RequestTimelineInput& input_;
  std::vector<RequestTimelineSpan> spans_;
};

// The prefill node's span args travel as doubles; counts are written as integers again.
TimelineArgValue count_or_measurement(double value) {
  if (std::nearbyint(value) == value && std::fabs(value) < 9e15) {
    return static_cast<int64_t>(value);
  }
  return value;
}

void add_prefill_chunks(SpanList& spans, const ChoiceTimeline& choice) {
  // A prefix hit in the lower KV tiers, reloaded before the rest of the prompt was computed.
  if (const std::optional<KvReloadTiming>& reload = choice.timings.kv_reload) {
    TimelineArgs& args =
        spans.add_here("prefill.kv_reload", reload->start, reload->end, choice.index);
    args["host_blocks"] = int64_t{reload->host_blocks};
    args["disk_blocks"] = int64_t{reload->disk_blocks};
    args["tokens"] = int64_t{reload->tokens};
    args["ok"] = int64_t{reload->ok ? 1 : 0};
  }
  for (const PrefillChunkTiming& chunk : choice.timings.prefill_chunks) {
    TimelineArgs& args = spans.add_here("prefill.chunk", chunk.start, chunk.end, choice.index);
    args["prompt_tokens"] = int64_t{chunk.prompt_tokens};
    args["batch_tokens"] = int64_t{chunk.batch_tokens};
  }
}

// Prompt computed here: queue, chunks; the first token came out of the last chunk.
void add_local_prefill(SpanList& spans, const ChoiceTimeline& choice) {
  const RequestTimings& timings = choice.timings;
  if (timings.first_scheduled) {
    spans.add_here("prefill.queue", timings.arrival, *timings.first_scheduled, choice.index);
    spans.add_here("decode.queue", timings.arrival, *timings.first_scheduled, choice.index);
  }
  add_prefill_chunks(spans, choice);
}

// Prompt computed on a prefill node: the exchange as seen here, the prefill node's own spans
// moved onto this clock, then the wait for the KV.
void add_remote_prefill(SpanList& spans, const ChoiceTimeline& choice,
                        const RemotePrefillStats& remote) {
  const RequestTimings& timings = choice.timings;
  const SteadyTime no_time{};
  if (remote.work_posted != no_time && remote.first_token_received != no_time) {
    TimelineArgs& args = spans.add_here("prefill.remote", remote.work_posted,
                                        remote.first_token_received, choice.index);
    args["prefill_url"] = remote.prefill_url;
  }
  if (remote.work_posted != no_time && remote.head_received != no_time) {
    const double receipt = aligned_receipt_ms(spans.ms(remote.work_posted),
                                              spans.ms(remote.head_received), remote.head_sent_ms);
    const std::string node = "prefill " + remote.prefill_url;
    for (const TimelineSpan& span : remote.spans) {
      TimelineArgs& args =
          spans.add(span.name, node, receipt + span.start_ms, receipt + span.end_ms, choice.index);
      for (const auto& [key, value] : span.args) args[key] = count_or_measurement(value);
    }
  }
  // Chunks computed here too (only when the import fell back to a local prefill).
  add_prefill_chunks(spans, choice);
  if (remote.first_token_received != no_time && timings.kv_ready) {
    spans.add_here("decode.kv_wait", remote.first_token_received, *timings.kv_ready, choice.index);
  }
  if (timings.kv_ready && timings.first_scheduled) {
    spans.add_here("decode.queue", *timings.kv_ready, *timings.first_scheduled, choice.index);
  }
}

// The steps after the first token: from its first decode step (after the last local prefill
// chunk, or once the imported KV is scheduled) to the final token.
void add_decode_steps(SpanList& spans, const ChoiceTimeline& choice) {
  const RequestTimings& timings = choice.timings;
  if (choice.completion_tokens < 2 || !timings.finished) return;
  std::optional<SteadyTime> start;
  if (choice.remote_prefill) {
    start = timings.first_scheduled;
  } else if (!timings.prefill_chunks.empty()) {
    start = timings.prefill_chunks.back().end;
  } else {
    start = timings.first_token;
  }
  if (!start) return;
  TimelineArgs& args = spans.add_here("decode.steps", *start, *timings.finished, choice.index);
  args["tokens"] = int64_t{choice.completion_tokens - 1};
}

// The part of the transfer after the prefill node's last forward step: what the transfer adds
// to the request once the prompt is computed (with layer-by-layer sending most of it is
// hidden under the forward). None without both spans.
std::optional<double> exposed_transfer_ms(const RemotePrefillStats& remote) {
  std::optional<double> transfer_end;
  std::optional<double> forward_end;
  for (const TimelineSpan& span : remote.spans) {
    if (span.name == "kv.transfer") transfer_end = span.end_ms;
    if (span.name == "prefill.chunk")
      forward_end = std::max(forward_end.value_or(0.0), span.end_ms);
  }
  if (!transfer_end || !forward_end) return std::nullopt;
  return std::max(0.0, *transfer_end - *forward_end);
}

KvTransferSummary kv_transfer_summary(const RemotePrefillStats& remote) {
  KvTransferSummary out;
  out.bytes = remote.transfer_bytes;
  out.blocks = remote.transfer_blocks;
  out.ms = remote.transfer_seconds * 1000.0;
  // Only a transfer that did not wait for the forward measures the link.
  if (remote.transfer_layers_overlapped == 0 && remote.transfer_seconds > 0) {
    out.gb_per_s = static_cast<double>(remote.transfer_bytes) / remote.transfer_seconds / 1e9;
  }
  out.exposed_ms = exposed_transfer_ms(remote);
  out.layers = remote.transfer_layers;
  out.layers_overlapped = remote.transfer_layers_overlapped;
  return out;
}

}  // namespace

double milliseconds_after(SteadyTime origin, SteadyTime time) {
  return std::chrono::duration<double, std::milli>(time - origin).count();
}

double aligned_receipt_ms(double sent_ms, double head_received_ms, double head_sent_ms) {
  // A callee that says it held the request longer than the round trip took (clocks that run
  // at slightly different rates) received it when it was sent, not before.
  return sent_ms + std::max(0.0, (head_received_ms - sent_ms) - head_sent_ms) / 2.0;
}

std::optional<double> time_per_output_token_ms(double ttft_ms, double e2e_ms, int output_tokens) {
  if (output_tokens < 2) return std::nullopt;
  return (e2e_ms - ttft_ms) / (output_tokens - 1);
}

RequestTimeline build_request_timeline(const RequestTimelineInput& input) {
  SpanList spans(input);
  for (const ChoiceTimeline& choice : input.choices) {
    spans.add_here("decode.request", input.arrival, choice.final_delta, choice.index);
    if (choice.remote_prefill) {
      add_remote_prefill(spans, choice, *choice.remote_prefill);
    } else {
      add_local_prefill(spans, choice);
    }
    add_decode_steps(spans, choice);
  }

  RequestTimeline timeline;
  timeline.request_id = input.request_id;
  timeline.trace_id = input.trace_id;
  timeline.origin = TimelineOrigin::kDecode;
  timeline.head_sent_ms = spans.ms(input.head_sent);
  timeline.spans = spans.take();
  for (SteadyTime time : input.token_times) timeline.tokens_ms.push_back(spans.ms(time));
  const int output_tokens = static_cast<int>(input.token_times.size());
  timeline.output_tokens = output_tokens;
  if (!input.token_times.empty()) timeline.ttft_ms = timeline.tokens_ms.front();
  timeline.e2e_ms = input.choices.empty() ? 0.0 : spans.ms(input.choices.front().final_delta);
  timeline.tpot_ms =
      time_per_output_token_ms(timeline.ttft_ms.value_or(0.0), timeline.e2e_ms, output_tokens);
  // Only once the KV has landed are the transfer's figures known (a request ended by its first
  // token does not wait for them).
  if (!input.choices.empty() && input.choices.front().remote_prefill &&
      input.choices.front().timings.kv_ready) {
    timeline.kv_transfer = kv_transfer_summary(*input.choices.front().remote_prefill);
  }
  if (!input.choices.empty() && input.choices.front().spec_decode.num_drafts > 0) {
    const SpecDecodeCounts& counts = input.choices.front().spec_decode;
    timeline.spec_decode =
        SpecDecodeSummary{counts.num_drafts, counts.num_draft_tokens, counts.num_accepted_tokens};
  }
  return timeline;
}

}  // namespace pdserve
