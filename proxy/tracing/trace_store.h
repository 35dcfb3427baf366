// The last N finished requests' aligned timelines, for GET /trace. Thread-safe.
#pragma once

#include <deque>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "proxy/tracing/chrome_trace.h"

namespace pdserve::proxy {

class TraceStore {
 public:
  explicit TraceStore(size_t capacity);  // capacity >= 1 (PDS_CHECK)

  size_t capacity() const { return capacity_; }
  // Keeps `request`, dropping the oldest one when full.
  void add(RecordedTimeline request);
  // The newest `count` requests (fewer when fewer finished), oldest first.
  std::vector<RecordedTimeline> last(size_t count) const;
  // The newest request with this id.
  std::optional<RecordedTimeline> find(std::string_view request_id) const;

 private:
  const size_t capacity_;
  mutable std::mutex mutex_;
  std::deque<RecordedTimeline> requests_;
};

}  // namespace pdserve::proxy
