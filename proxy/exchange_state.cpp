#include "proxy/exchange_state.h"

namespace pdserve::proxy {

const char* exchange_state_name(ExchangeState state) {
  switch (state) {
    case ExchangeState::kRouting:
      return "routing";
    case ExchangeState::kAwaitingHead:
      return "awaiting_head";
    case ExchangeState::kRefused:
      return "refused";
    case ExchangeState::kBuffering:
      return "buffering";
    case ExchangeState::kStreaming:
      return "streaming";
    case ExchangeState::kDiscarding:
      return "discarding";
    case ExchangeState::kDone:
      return "done";
  }
  return "?";
}

bool ExchangeLifecycle::calling() const {
  switch (state_) {
    case ExchangeState::kAwaitingHead:
    case ExchangeState::kRefused:
    case ExchangeState::kBuffering:
    case ExchangeState::kStreaming:
    case ExchangeState::kDiscarding:
      return true;
    case ExchangeState::kRouting:
    case ExchangeState::kDone:
      return false;
  }
  return false;
}

ExchangeActions ExchangeLifecycle::finish(ExchangeEnd end) {
  state_ = ExchangeState::kDone;
  ExchangeActions actions;
  actions.end = end;
  return actions;
}

ExchangeActions ExchangeLifecycle::no_node() {
  if (state_ != ExchangeState::kRouting) return {};
  if (client_stream_open_) return finish(ExchangeEnd::kNoNodeToResume);
  // Backpressure: the decode pool is full, not broken; the client should come back.
  return finish(busy_ ? ExchangeEnd::kAllBusy : ExchangeEnd::kNoNode);
}

ExchangeActions ExchangeLifecycle::resume_unreadable() {
  if (state_ != ExchangeState::kRouting) return {};
  return finish(ExchangeEnd::kResumeUnreadable);
}

void ExchangeLifecycle::call_started() {
  if (state_ != ExchangeState::kRouting) return;
  state_ = ExchangeState::kAwaitingHead;
  status_ = 0;
  contentless_ = false;
}

ExchangeActions ExchangeLifecycle::head(const NodeHead& head) {
  if (state_ != ExchangeState::kAwaitingHead) return {};  // the client left meanwhile
  status_ = head.status;
  contentless_ = head.contentless;
  ExchangeActions actions;
  if ((head.status == 429 || head.status == 503) && head.can_retry) {
    busy_ = busy_ || head.status == 429;
    state_ = ExchangeState::kRefused;
  } else if (client_stream_open_) {
    // A resumption: only a stream continues the client's; anything else ends it (call_ended).
    state_ = head.status == 200 && head.event_stream ? ExchangeState::kStreaming
                                                     : ExchangeState::kDiscarding;
  } else if (head.event_stream && !head.contentless) {
    state_ = ExchangeState::kStreaming;
    client_stream_open_ = true;
    actions.open_client_stream = true;
  } else {
    state_ = ExchangeState::kBuffering;
  }
  return actions;
}

BodyAction ExchangeLifecycle::body() {
  BodyAction action;
  switch (state_) {
    case ExchangeState::kRefused:
      action.use = BodyUse::kRefusal;
      return action;
    case ExchangeState::kBuffering:
      action.use = BodyUse::kBuffer;
      break;
    case ExchangeState::kStreaming:
      action.use = BodyUse::kRelay;
      break;
    case ExchangeState::kDiscarding:
      action.use = BodyUse::kDrop;
      break;
    case ExchangeState::kRouting:
    case ExchangeState::kAwaitingHead:
    case ExchangeState::kDone:
      return action;
  }
  action.first_byte = !first_byte_;
  first_byte_ = true;
  return action;
}

ExchangeActions ExchangeLifecycle::relay_overflowed() {
  if (state_ != ExchangeState::kStreaming) return {};
  ExchangeActions actions = finish(ExchangeEnd::kEventTooLarge);
  actions.cancel_call = true;
  return actions;
}

ExchangeActions ExchangeLifecycle::buffer_overflowed() {
  if (state_ != ExchangeState::kBuffering) return {};
  ExchangeActions actions = finish(ExchangeEnd::kAnswerTooLarge);
  actions.cancel_call = true;
  return actions;
}

ExchangeActions ExchangeLifecycle::client_write_failed() {
  // The client's stream is over either way: the cancelled call's end must not read as the
  // node failing (marked down, the stream resumed on another node).
  return client_left();
}

ExchangeActions ExchangeLifecycle::failed_mid_answer(bool resumable) {
  ExchangeActions actions;
  if (state_ == ExchangeState::kStreaming && resumable) {
    // Another decode node continues the stream from the last event the client got.
    state_ = ExchangeState::kRouting;
    actions.route_again = true;
    actions.count_resume = true;
  } else {
    actions = finish(ExchangeEnd::kNodeFailed);
  }
  actions.node_failed = true;
  return actions;
}

ExchangeActions ExchangeLifecycle::call_ended(bool ok, bool resumable) {
  ExchangeActions actions;
  switch (state_) {
    case ExchangeState::kRouting:
    case ExchangeState::kDone:
      return actions;
    case ExchangeState::kAwaitingHead:
      // Never answered: the node is gone. Another one may take the request as it is.
      state_ = ExchangeState::kRouting;
      actions.node_failed = true;
      actions.route_again = true;
      return actions;
    case ExchangeState::kRefused:
      if (!ok) return failed_mid_answer(false);  // the refusal itself was cut
      state_ = ExchangeState::kRouting;
      actions.keep_refusal = status_ == 503;
      actions.count_retry = true;
      actions.route_again = true;
      return actions;
    case ExchangeState::kStreaming:
      return ok ? finish(ExchangeEnd::kAnswer) : failed_mid_answer(resumable);
    case ExchangeState::kBuffering:
      if (!ok) return failed_mid_answer(false);
      return finish(contentless_ ? ExchangeEnd::kContentless : ExchangeEnd::kAnswer);
    case ExchangeState::kDiscarding:
      return ok ? finish(ExchangeEnd::kResumeRefused) : failed_mid_answer(false);
  }
  return actions;
}

ExchangeActions ExchangeLifecycle::client_left() {
  if (state_ == ExchangeState::kDone) return {};
  ExchangeActions actions;
  actions.cancel_call = calling();
  state_ = ExchangeState::kDone;
  return actions;
}

}  // namespace pdserve::proxy
