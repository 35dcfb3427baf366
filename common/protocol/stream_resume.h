// A stream the proxy can continue on another decode node when its node fails mid-stream
// (issue #15 item 10). Two typed messages, each with one serialiser and one parser:
//  * StreamCheckpoint, node -> proxy: an SSE comment (`: pdserve_resume {json}`) written just
//    before each event of a resumable stream: the tokens new since the previous checkpoint and
//    the sampler's state after them. The proxy strips it; once the event after it reached the
//    client, its tokens count as delivered.
//  * StreamResume, proxy -> decode node (the request body's `pdserve_resume` field, cluster
//    token only; a body field because a long stream's tokens outgrow a header): the response's
//    id and created time, every token delivered so far and the sampler's state after the last
//    of them. The node prefills prompt + those tokens and streams the rest under the same id,
//    without the role chunk or the echo the client already has.
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
  std::vector<int32_t> token_ids;                  // new since the previous checkpoint
  std::optional<SamplerRng::State> sampler_state;  // after them; none before the first token

  // The whole SSE comment event, blank line included.
  std::string to_comment() const;
  // From the comment event (with or without its blank line); InvalidArgument when malformed.
  static Result<StreamCheckpoint> parse_comment(std::string_view event);
};

struct StreamResume {
  std::string id;
  int64_t created = 0;
  std::vector<int32_t> output_token_ids;           // every token delivered so far
  std::optional<SamplerRng::State> sampler_state;  // required when output_token_ids is not empty

  nlohmann::json to_json() const;
  // InvalidArgument when malformed (a 400 for the caller).
  static Result<StreamResume> parse(const nlohmann::json& json);
};

}  // namespace pdserve
