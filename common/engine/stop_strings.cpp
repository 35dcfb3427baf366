#include "common/engine/stop_strings.h"

#include <algorithm>
#include <utility>

namespace pdserve {
namespace {

struct Found {
  size_t begin = std::string::npos;
  size_t end = std::string::npos;
  size_t stop_index = 0;
};

// The match that completes first in `text`. For one stop string, its first occurrence is also
// its earliest-ending one.
Found first_completed_match(std::string_view text, const std::vector<std::string>& stops) {
  Found best;
  for (size_t i = 0; i < stops.size(); ++i) {
    const std::string& stop = stops[i];
    if (stop.empty()) continue;
    size_t begin = text.find(stop);
    if (begin == std::string_view::npos) continue;
    size_t end = begin + stop.size();
    if (end < best.end || (end == best.end && begin < best.begin)) best = {begin, end, i};
  }
  return best;
}

}  // namespace

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops, bool include_stop_string)
    : stops_(std::move(stops)), include_stop_string_(include_stop_string) {}

size_t StopStringMatcher::partial_match_length() const {
  size_t longest = 0;
  for (const std::string& stop : stops_) {
    if (stop.empty()) continue;
    size_t limit = std::min(stop.size() - 1, held_.size());
    for (size_t length = limit; length > longest; --length) {
      if (std::string_view(held_).substr(held_.size() - length) ==
          std::string_view(stop).substr(0, length)) {
        longest = length;
        break;
      }
    }
  }
  return longest;
}

std::string StopStringMatcher::push(std::string_view piece) {
  if (match_) return {};
  held_.append(piece);
  // Text emitted earlier cannot begin a match (it was not a prefix of any stop string when it
  // was let go), so searching the held tail plus the new piece finds the first completed match.
  Found found = first_completed_match(held_, stops_);
  if (found.begin != std::string::npos) {
    match_ = StopMatch{found.stop_index, stops_[found.stop_index]};
    std::string out = held_.substr(0, include_stop_string_ ? found.end : found.begin);
    held_.clear();
    return out;
  }
  size_t keep = partial_match_length();
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStringMatcher::finish() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

StopStringResult apply_stop_strings(std::string_view text, const std::vector<std::string>& stops,
                                    bool include_stop_string) {
  Found found = first_completed_match(text, stops);
  if (found.begin == std::string::npos) return {std::string(text), std::nullopt};
  return {std::string(text.substr(0, include_stop_string ? found.end : found.begin)),
          StopMatch{found.stop_index, stops[found.stop_index]}};
}

}  // namespace pdserve
