// A stream the proxy can continue on another decode node when its node fails mid-stream
// (issue #15 item 10), with any number of choices (n, several prompts). Two typed messages,
// each with one serialiser and one parser:
//  * StreamCheckpoint, node -> proxy: an SSE comment (`: pdserve_resume {json}`) written just
//    before each event of a resumable stream: the event's choice, the tokens of that choice new
//    since its previous checkpoint and its sampler's state after them. The proxy strips it;
//    once the event after it reached the client, its tokens count as delivered.
//  * StreamResume, proxy -> decode node (the request body's `pdserve_resume` field, cluster
//    token only; a body field because a long stream's tokens outgrow a header): the response's
//    id and created time and, per choice, every token delivered so far, the sampler's state
//    after the last of them and whether its finish chunk was delivered. The node prefills
//    prompt + those tokens and streams the rest of the unfinished choices under the same id,
//    without the role chunks or the echo the client already has.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/core/status.h"
#include "common/sampling/sampler_rng.h"

namespace pdserve {

inline constexpr std::string_view kStreamCheckpointPrefix = ": pdserve_resume ";
inline constexpr const char* kStreamResumeField = "pdserve_resume";

struct StreamCheckpoint {
  std::string id;  // the response's id ("cmpl-...", "chatcmpl-...")
  int64_t created = 0;
  int choices = 1;  // how many choices the stream has
  int index = 0;    // the choice of the event that follows
  std::vector<int32_t> token_ids;                  // of that choice, new since its previous one
  std::optional<SamplerRng::State> sampler_state;  // after them; none before its first token

  // The whole SSE comment event, blank line included.
  std::string to_comment() const;
  // From the comment event (with or without its blank line); InvalidArgument when malformed.
  // A comment without "choices" and "index" (a node of an older version) is choice 0 of 1.
  static Result<StreamCheckpoint> parse_comment(std::string_view event);
  // The comment's JSON object, and back (stream_event.h reads comments of any spacing).
  nlohmann::json to_json() const;
  static Result<StreamCheckpoint> parse(const nlohmann::json& json);

  bool operator==(const StreamCheckpoint&) const = default;
};

// One choice of a stream to continue.
struct ResumedChoice {
  std::vector<int32_t> output_token_ids;           // every token of it delivered so far
  std::optional<SamplerRng::State> sampler_state;  // required when it has tokens and goes on
  bool finished = false;  // its finish chunk was delivered: nothing of it is left to stream
};

struct StreamResume {
  std::string id;
  int64_t created = 0;
  std::vector<ResumedChoice> choices;  // every choice of the stream, by index

  nlohmann::json to_json() const;
  // InvalidArgument when malformed (a 400 for the caller).
  static Result<StreamResume> parse(const nlohmann::json& json);
};

// The most choices a resumable stream may have (a bound for the parsers, well above the API's n).
inline constexpr int kMaxStreamChoices = 1 << 16;

}  // namespace pdserve
