// Incremental stop-string matching over streamed text (OpenAI `stop`).
//
// Text arrives in pieces as it is detokenized. push() returns only text that can no longer be
// the start of a stop string, so no partial stop string is ever streamed; the longest tail that
// is a proper prefix of some stop string is held back until later text settles it. The first
// full match ends the stream: the text is truncated where the match begins (or, with
// include_stop_string, where it ends) and the matched string is reported.
//
// "First" means the match that completes first in the stream: the smallest end offset, and of
// matches ending at the same offset the one that starts earliest (the longest). The result
// never depends on how the text is split into pieces. Matching is on bytes; since pieces and
// stop strings are whole UTF-8, held-back boundaries and matches fall between characters.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pdserve {

struct StopMatch {
  size_t stop_index = 0;  // index into the stop strings given to the matcher
  std::string stop;       // the stop string that matched
};

class StopStringMatcher {
 public:
  // Empty stop strings are ignored (they would match before any text); callers reject them at
  // request validation.
  explicit StopStringMatcher(std::vector<std::string> stops, bool include_stop_string = false);

  // Feeds the next piece; returns the text that is now safe to emit. After a match every later
  // push returns "".
  std::string push(std::string_view piece);
  // Ends the stream without a match: returns the held-back tail ("" after a match).
  std::string finish();

  const std::optional<StopMatch>& match() const { return match_; }
  // Bytes currently held back (never more than the longest stop string minus one).
  size_t held_bytes() const { return held_.size(); }

 private:
  // Length of the longest suffix of held_ that is a proper prefix of some stop string.
  size_t partial_match_length() const;

  std::vector<std::string> stops_;
  bool include_stop_string_;
  std::string held_;
  std::optional<StopMatch> match_;
};

// The whole-text result of the same rules: `text` truncated at the first match, and the match.
struct StopStringResult {
  std::string text;
  std::optional<StopMatch> match;
};
StopStringResult apply_stop_strings(std::string_view text, const std::vector<std::string>& stops,
                                    bool include_stop_string = false);

}  // namespace pdserve
