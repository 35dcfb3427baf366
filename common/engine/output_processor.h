// What a request's deltas say, built from its sampled tokens (what vLLM keeps outside its
// engine core):
//  * text comes from an IncrementalDetokenizer (complete UTF-8 only) passed through a
//    StopStringMatcher, so no partial stop string is ever streamed; a stop-string match ends
//    the request at once (FinishReason kStop, matched_stop set);
//  * the text of a token that ends the request as EOS or a stop token id is left out unless
//    include_stop_str_in_output (vLLM's rule); ids the tokenizer does not know (a model's
//    padded vocabulary rows) produce no text;
//  * a stream resumed from another node catches its text state up on the tokens the client
//    already has, so its first delta starts where the client's text ends.
// One RequestOutput per request holds that state; the OutputProcessor, shared by all of them,
// turns tokens into deltas. Neither touches the scheduler or a sink.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/core/status.h"
#include "common/engine/inference_service.h"
#include "common/engine/scheduler.h"
#include "common/engine/stop_strings.h"
#include "common/tokenizer/tokenizer.h"

namespace pdserve {

// The output side of one request: its text state and what its deltas report.
struct RequestOutput {
  RequestOutput(const Tokenizer& tokenizer, const InferenceRequest& request);

  std::string request_id;
  bool include_stop_str_in_output;
  IncrementalDetokenizer detokenizer;
  StopStringMatcher stop_matcher;
  RequestTimings timings;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_prompt_tokens = 0;
  std::optional<SampledTokenLogprobs> step_logprobs;  // of the token the next delta carries
  // Requests with prompt_logprobs: those computed so far (one per prompt token after the
  // first, in order), until the first delta carries them.
  std::optional<std::vector<PromptTokenLogprob>> prompt_logprobs;
  bool prompt_logprobs_delivered = false;
  std::optional<RemotePrefillStats> remote_prefill;
  std::optional<std::string> resumed_text;  // until the first delta carries it
  bool resumed = false;                     // a stream resumed from another node
  SpecDecodeCounts spec_decode;             // its drafts so far (speculative decoding)
};

class OutputProcessor {
 public:
  // `eos_token_ids` and `vocab_size` are the scheduler's (for a resumed stream's stop checks).
  OutputProcessor(Tokenizer tokenizer, std::vector<int32_t> eos_token_ids, int vocab_size);

  // A resumed stream's text state caught up on its delivered tokens (held-back bytes
  // included); its first delta will carry their text as resumed_text. InvalidArgument when
  // they already hold a stop string.
  Status catch_up(RequestOutput& output, std::span<const int32_t> delivered) const;
  // When a resumed stream's delivered output already ends it (max_tokens, a stop token or a
  // stop string: the first node was cut between its last token's event and its finish
  // chunk), the final delta that ends it at once, without tokens (ended_before_resume);
  // nullopt when there is more to generate. `request` passed EngineCore::validate.
  std::optional<SequenceDelta> resumed_output_end(const InferenceRequest& request) const;

  // The delta of one new token: its id, text, logprobs (step_logprobs) and, on a resumed
  // stream's first delta, resumed_text. Finished when the update ends the request or a stop
  // string matched (finish_reason kStop, matched_stop): the caller then ends the sequence.
  SequenceDelta token_delta(RequestOutput& output, const SequenceUpdate& update) const;
  // A delta with the request's figures and no tokens (for a final delta with an error).
  static SequenceDelta make_delta(const RequestOutput& output);

 private:
  // Pushes tokens through a detokenizer and stop matcher; returns the text they stream.
  std::string replay_text(IncrementalDetokenizer& detokenizer, StopStringMatcher& matcher,
                          std::span<const int32_t> tokens) const;

  Tokenizer tokenizer_;
  std::vector<int32_t> eos_token_ids_;
  int vocab_size_;
};

}  // namespace pdserve
