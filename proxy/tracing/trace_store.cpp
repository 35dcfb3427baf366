#include "proxy/tracing/trace_store.h"

#include <algorithm>

#include "common/core/status.h"

namespace pdserve::proxy {

TraceStore::TraceStore(size_t capacity) : capacity_(capacity) {
  PDS_CHECK(capacity >= 1, "a trace store keeps at least one request");
}

void TraceStore::add(RecordedTimeline request) {
  std::lock_guard lock(mutex_);
  if (requests_.size() == capacity_) requests_.pop_front();
  requests_.push_back(std::move(request));
}

std::vector<RecordedTimeline> TraceStore::last(size_t count) const {
  std::lock_guard lock(mutex_);
  const size_t first = requests_.size() - std::min(count, requests_.size());
  return {requests_.begin() + static_cast<std::ptrdiff_t>(first), requests_.end()};
}

std::optional<RecordedTimeline> TraceStore::find(std::string_view request_id) const {
  std::lock_guard lock(mutex_);
  for (auto it = requests_.rbegin(); it != requests_.rend(); ++it) {
    if (it->timeline.request_id == request_id) return *it;
  }
  return std::nullopt;
}

}  // namespace pdserve::proxy
