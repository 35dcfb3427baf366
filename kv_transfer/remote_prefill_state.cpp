#include "kv_transfer/remote_prefill_state.h"

namespace pdserve::kv_transfer {

const char* import_state_name(ImportState state) {
  switch (state) {
    case ImportState::kPosting:
      return "posting";
    case ImportState::kPosted:
      return "posted";
    case ImportState::kPrefilling:
      return "prefilling";
    case ImportState::kFirstToken:
      return "first_token";
    case ImportState::kVerifying:
      return "verifying";
    case ImportState::kReady:
      return "ready";
    case ImportState::kCancelling:
      return "cancelling";
    case ImportState::kFailed:
      return "failed";
    case ImportState::kReleased:
      return "released";
  }
  return "?";
}

RemotePrefillState::RemotePrefillState(Clock::time_point deadline, Clock::duration hold,
                                       bool verify_checksums)
    : deadline_(deadline), hold_(hold), verify_checksums_(verify_checksums) {}

bool RemotePrefillState::releasable(Clock::time_point now) const {
  return state_ == ImportState::kReady || state_ == ImportState::kReleased ||
         (release_at_ && now >= *release_at_);
}

bool RemotePrefillState::hold_expired(Clock::time_point now) const {
  return (state_ == ImportState::kCancelling || state_ == ImportState::kFailed) && release_at_ &&
         now >= *release_at_;
}

void RemotePrefillState::report_failure(ImportActions& actions, const Status& why) {
  if (reported_) return;
  reported_ = true;
  actions.report_failure = why;
}

void RemotePrefillState::maybe_ready(ImportActions& actions) {
  if (state_ != ImportState::kFirstToken || !landed_ || !(kv_sent_ || stream_ended_)) return;
  if (verify_checksums_) {
    if (!kv_sent_) {
      // Fail closed: without kv_sent there are no checksums to trust the blocks with. Nothing
      // can land after the completion message.
      report_failure(actions, unavailable("the prefill node's stream ended without kv_sent: "
                                          "the KV cannot be verified"));
      state_ = ImportState::kReleased;
      return;
    }
    state_ = ImportState::kVerifying;
    actions.verify = true;
    return;
  }
  state_ = ImportState::kReady;
  reported_ = true;
  actions.report_ready = true;
}

ImportActions RemotePrefillState::verified(const Status& outcome, bool another_node) {
  ImportActions actions;
  if (state_ != ImportState::kVerifying) return actions;  // given up meanwhile
  if (outcome.ok()) {
    state_ = ImportState::kReady;
    reported_ = true;
    actions.report_ready = true;
  } else if (another_node) {
    refetching_ = true;
    actions.retry_next_node = true;
  } else {
    report_failure(actions, outcome);
    state_ = ImportState::kReleased;
  }
  return actions;
}

// Failed or cancelled before the KV landed: report it, then wait for the prefill node to
// confirm that nothing more can land (or the hold deadline).
ImportActions RemotePrefillState::give_up(ImportState to, const Status& why,
                                          Clock::time_point now) {
  ImportActions actions;
  report_failure(actions, why);
  if (landed_ || (stream_ended_ && (!sent_ || refused()))) {
    // The completion message follows every put; a call that ended before anything reached the
    // prefill node, or with a refusal, started nothing there.
    state_ = ImportState::kReleased;
    return actions;
  }
  state_ = to;
  if (hold_reason_.ok()) hold_reason_ = why;
  const Clock::time_point hold_until = now + hold_;
  if (!release_at_ || *release_at_ > hold_until) release_at_ = hold_until;
  if (stream_ended_) return actions;  // nobody left to confirm: the hold deadline decides
  if (!sent_) {
    // Nothing reached the prefill node yet: close the call; its end confirms.
    actions.cancel_call = true;
  } else {
    // Ask the prefill node to abort this work, and keep listening: its kv_failed or error
    // event (or the completion message) confirms.
    actions.send_cancel = true;
  }
  return actions;
}

ImportActions RemotePrefillState::work_sent() {
  ImportActions actions;
  const bool already = sent_;
  sent_ = true;
  switch (state_) {
    case ImportState::kPosting:
      state_ = ImportState::kPosted;
      break;
    case ImportState::kCancelling:
    case ImportState::kFailed:
      // Given up while the call was connecting, and its bytes went out anyway (the close
      // raced the send): the prefill node may get the work; tell it to drop it.
      if (!already) actions.send_cancel = true;
      break;
    default:
      break;
  }
  return actions;
}

ImportActions RemotePrefillState::head(int http_status) {
  http_status_ = http_status;
  sent_ = true;
  if (http_status == 200 &&
      (state_ == ImportState::kPosting || state_ == ImportState::kPosted)) {
    state_ = ImportState::kPrefilling;
  }
  return {};
}

ImportActions RemotePrefillState::first_token(Clock::time_point now,
                                              Clock::time_point kv_deadline) {
  if (first_token_) {
    return fail(unavailable("the prefill node sent a second first token"), now);
  }
  first_token_ = true;
  ImportActions actions;
  if (state_ != ImportState::kPrefilling) return actions;  // cancelling or failed: not wanted
  state_ = ImportState::kFirstToken;
  deadline_ = kv_deadline;
  actions.report_first_token = !refetching_;
  maybe_ready(actions);
  return actions;
}

ImportActions RemotePrefillState::kv_sent() {
  kv_sent_ = true;
  ImportActions actions;
  maybe_ready(actions);
  return actions;
}

ImportActions RemotePrefillState::prefill_ended_without_kv(const Status& why) {
  ImportActions actions;
  if (state_ == ImportState::kReady || state_ == ImportState::kReleased) return actions;
  report_failure(actions, why);
  state_ = ImportState::kReleased;
  return actions;
}

ImportActions RemotePrefillState::landed_now() {
  landed_ = true;
  ImportActions actions;
  if (state_ == ImportState::kCancelling || state_ == ImportState::kFailed) {
    state_ = ImportState::kReleased;
  } else {
    maybe_ready(actions);
  }
  return actions;
}

ImportActions RemotePrefillState::prefill_settled() {
  if (state_ == ImportState::kCancelling || state_ == ImportState::kFailed) {
    state_ = ImportState::kReleased;
  }
  return {};
}

ImportActions RemotePrefillState::call_ended(const Status& why, bool another_node,
                                             Clock::time_point now) {
  stream_ended_ = true;
  ImportActions actions;
  switch (state_) {
    case ImportState::kReady:
    case ImportState::kReleased:
      return actions;
    case ImportState::kCancelling:
    case ImportState::kFailed:
      if (!sent_ || refused()) state_ = ImportState::kReleased;
      return actions;
    case ImportState::kPosting:
    case ImportState::kPosted:
      if (sent_ && !refused()) {
        // Transport failed before the head, after the work may have gone out: the prefill
        // node may be computing and writing into the blocks. No retry (another node would
        // write into the same blocks); hold them.
        return give_up(ImportState::kFailed, why, now);
      }
      [[fallthrough]];
    case ImportState::kPrefilling:
      if (refused() || !sent_) {
        // Nothing started there: the next prefill node may take the work.
        if (another_node) {
          actions.retry_next_node = true;
          return actions;
        }
        report_failure(actions, why);
        state_ = ImportState::kReleased;
        return actions;
      }
      // Accepted, then ended without a first token.
      return give_up(ImportState::kFailed, why, now);
    case ImportState::kFirstToken:
      // The completion message may still be on its way: the deadline covers it.
      maybe_ready(actions);
      return actions;
    case ImportState::kVerifying:
      return actions;  // everything needed is here
  }
  return actions;
}

ImportActions RemotePrefillState::cancel(const Status& why, Clock::time_point now) {
  return give_up_unless_over(ImportState::kCancelling, why, now);
}

ImportActions RemotePrefillState::fail(const Status& why, Clock::time_point now) {
  return give_up_unless_over(ImportState::kFailed, why, now);
}

ImportActions RemotePrefillState::give_up_unless_over(ImportState next, const Status& why,
                                                      Clock::time_point now) {
  switch (state_) {
    case ImportState::kReady:
    case ImportState::kReleased:
    case ImportState::kCancelling:
    case ImportState::kFailed:
      return {};  // landed, or already given up
    default:
      return give_up(next, why, now);
  }
}

bool RemotePrefillState::overdue(Clock::time_point now) const {
  return !reported_ && now > deadline_ &&
         (state_ == ImportState::kPosting || state_ == ImportState::kPosted ||
          state_ == ImportState::kPrefilling || state_ == ImportState::kFirstToken);
}

void RemotePrefillState::restart(Clock::time_point deadline) {
  state_ = ImportState::kPosting;
  deadline_ = deadline;
  http_status_ = 0;
  sent_ = false;
  stream_ended_ = false;
  // A re-fetch starts a new transfer: what the last one reported is not this one's.
  first_token_ = false;
  kv_sent_ = false;
  landed_ = false;
}

}  // namespace pdserve::kv_transfer
