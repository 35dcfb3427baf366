#include "serving/openai/response_lifecycle.h"

namespace pdserve {

const char* response_phase_name(ResponsePhase phase) {
  switch (phase) {
    case ResponsePhase::kAccepted:
      return "accepted";
    case ResponsePhase::kStreaming:
      return "streaming";
    case ResponsePhase::kAnswered:
      return "answered";
  }
  return "unknown";
}

bool ResponseLifecycle::open() {
  if (phase_ != ResponsePhase::kAccepted || !stream_) return false;
  phase_ = ResponsePhase::kStreaming;
  return true;
}

FailureDelivery ResponseLifecycle::fail() {
  const ResponsePhase before = phase_;
  phase_ = ResponsePhase::kAnswered;
  switch (before) {
    case ResponsePhase::kAccepted:
      return FailureDelivery::kErrorResponse;
    case ResponsePhase::kStreaming:
      return FailureDelivery::kErrorEvent;
    case ResponsePhase::kAnswered:
      break;
  }
  return FailureDelivery::kDropped;
}

bool ResponseLifecycle::finish() {
  if (phase_ == ResponsePhase::kAnswered) return false;
  phase_ = ResponsePhase::kAnswered;
  return true;
}

}  // namespace pdserve
