// The decode side's remote-prefill state machine against a fake transport: the test plays the
// HTTP call, the prefill node's events and the completion message, and checks what the
// connector is told to do and when the blocks may be freed (issue #15 items 6 and 7).
#include "kv_transfer/remote_prefill_state.h"

#include <gtest/gtest.h>

namespace pdserve::kv_transfer {
namespace {

using Clock = RemotePrefillState::Clock;
using std::chrono::seconds;

const Clock::time_point t0 = Clock::now();
constexpr auto kHold = seconds(32);  // transfer timeout 30 s + grace 2 s

RemotePrefillState fresh() { return RemotePrefillState(t0 + seconds(60), kHold); }

bool nothing(const ImportActions& a) {
  return !a.report_first_token && !a.report_ready && !a.report_failure && !a.retry_next_node &&
         !a.send_cancel && !a.cancel_call && !a.verify;
}

// Posted, accepted, first token reported; optionally with block checksums to verify once the
// KV has landed.
RemotePrefillState streaming(bool verify_checksums = false) {
  RemotePrefillState s(t0 + seconds(60), kHold, verify_checksums);
  EXPECT_TRUE(nothing(s.work_sent()));
  EXPECT_TRUE(nothing(s.head(200)));
  EXPECT_EQ(s.state(), ImportState::kPrefilling);
  const ImportActions a = s.first_token(t0, t0 + seconds(32));
  EXPECT_TRUE(a.report_first_token);
  EXPECT_EQ(s.state(), ImportState::kFirstToken);
  return s;
}

TEST(RemotePrefillState, FirstTokenThenTheKvThenReadyAndReleased) {
  RemotePrefillState s = streaming();
  EXPECT_FALSE(s.releasable(t0));
  EXPECT_TRUE(nothing(s.kv_sent()));
  const ImportActions a = s.landed_now();
  EXPECT_TRUE(a.report_ready);
  EXPECT_EQ(s.state(), ImportState::kReady);
  EXPECT_TRUE(s.releasable(t0));
  // The stream's end and a late cancel change nothing.
  EXPECT_TRUE(nothing(s.call_ended(Status::ok_status(), false, t0)));
  EXPECT_TRUE(nothing(s.cancel(cancelled("late"), t0)));
  EXPECT_EQ(s.state(), ImportState::kReady);
}

TEST(RemotePrefillState, TheCompletionMessageMayComeBeforeTheFirstTokenOrAfterTheStream) {
  RemotePrefillState s = fresh();
  s.work_sent();
  s.head(200);
  EXPECT_TRUE(nothing(s.landed_now()));
  const ImportActions first = s.first_token(t0, t0 + seconds(32));
  EXPECT_TRUE(first.report_first_token);
  EXPECT_FALSE(first.report_ready);  // kv_sent or the stream's end still missing
  EXPECT_TRUE(s.call_ended(Status::ok_status(), false, t0).report_ready);

  RemotePrefillState late = streaming();
  EXPECT_TRUE(nothing(late.call_ended(Status::ok_status(), false, t0)));
  EXPECT_EQ(late.state(), ImportState::kFirstToken);
  EXPECT_TRUE(late.landed_now().report_ready);
}

// Checksums on: the KV is not ready until the connector compared the landed blocks with
// kv_sent's checksums, whatever order the completion message, kv_sent and the first token
// come in.
TEST(RemotePrefillState, WithChecksumsTheKvIsVerifiedBeforeItIsReady) {
  for (int order = 0; order < 3; ++order) {
    SCOPED_TRACE(order);
    RemotePrefillState s(t0 + seconds(60), kHold, /*verify_checksums=*/true);
    s.work_sent();
    s.head(200);
    ImportActions last;
    if (order == 0) {
      EXPECT_TRUE(s.first_token(t0, t0 + seconds(32)).report_first_token);
      EXPECT_TRUE(nothing(s.kv_sent()));
      last = s.landed_now();
    } else if (order == 1) {
      EXPECT_TRUE(s.first_token(t0, t0 + seconds(32)).report_first_token);
      EXPECT_TRUE(nothing(s.landed_now()));
      last = s.kv_sent();
    } else {
      EXPECT_TRUE(nothing(s.landed_now()));
      EXPECT_TRUE(nothing(s.kv_sent()));
      last = s.first_token(t0, t0 + seconds(32));
      EXPECT_TRUE(last.report_first_token);
    }
    EXPECT_TRUE(last.verify);
    EXPECT_FALSE(last.report_ready);
    EXPECT_EQ(s.state(), ImportState::kVerifying);
    EXPECT_FALSE(s.releasable(t0)) << "the connector is reading the blocks";
    EXPECT_FALSE(s.overdue(t0 + seconds(3600))) << "everything needed is here";
    EXPECT_TRUE(nothing(s.call_ended(Status::ok_status(), false, t0)));
    const ImportActions verified = s.verified(Status::ok_status(), false);
    EXPECT_TRUE(verified.report_ready);
    EXPECT_EQ(s.state(), ImportState::kReady);
    EXPECT_TRUE(s.releasable(t0));
  }
}

TEST(RemotePrefillState, AChecksumMismatchFailsTheImportAndReleasesTheBlocksAtOnce) {
  RemotePrefillState s = streaming(/*verify_checksums=*/true);
  s.kv_sent();
  ASSERT_TRUE(s.landed_now().verify);
  const ImportActions a = s.verified(data_loss("block 0 differs"), false);
  ASSERT_TRUE(a.report_failure.has_value());
  EXPECT_EQ(a.report_failure->code(), StatusCode::kDataLoss);
  EXPECT_FALSE(a.report_ready);
  // The completion message followed every put: nothing can land any more.
  EXPECT_EQ(s.state(), ImportState::kReleased);
  EXPECT_TRUE(s.releasable(t0));
  EXPECT_TRUE(nothing(s.verified(Status::ok_status(), false)));
  EXPECT_TRUE(nothing(s.cancel(cancelled("late"), t0)));
}

TEST(RemotePrefillState, AChecksumMismatchWithAnotherNodeRefetchesWithoutASecondFirstToken) {
  RemotePrefillState s = streaming(/*verify_checksums=*/true);
  s.kv_sent();
  ASSERT_TRUE(s.landed_now().verify);
  const ImportActions a = s.verified(data_loss("block 0 differs"), /*another_node=*/true);
  EXPECT_TRUE(a.retry_next_node);
  EXPECT_FALSE(a.report_failure) << "the next node sends the KV again";
  EXPECT_FALSE(a.report_ready);
  EXPECT_TRUE(s.refetching());
  s.restart(t0 + seconds(120));
  EXPECT_EQ(s.state(), ImportState::kPosting);
  EXPECT_EQ(s.deadline(), t0 + seconds(120));
  EXPECT_FALSE(s.landed()) << "the last transfer's landing is not this one's";
  EXPECT_FALSE(s.overdue(t0 + seconds(100)));
  s.work_sent();
  s.head(200);
  const ImportActions first = s.first_token(t0, t0 + seconds(32));
  EXPECT_FALSE(first.report_first_token) << "the engine already has the first token";
  EXPECT_FALSE(first.report_failure) << "not a second first token of one exchange";
  EXPECT_EQ(s.state(), ImportState::kFirstToken);
  EXPECT_TRUE(nothing(s.kv_sent()));
  ASSERT_TRUE(s.landed_now().verify);
  EXPECT_TRUE(s.verified(Status::ok_status(), false).report_ready);
  EXPECT_EQ(s.state(), ImportState::kReady);

  // A second mismatch on the last node fails the import: the engine prefills locally.
  RemotePrefillState twice = streaming(/*verify_checksums=*/true);
  twice.kv_sent();
  twice.landed_now();
  ASSERT_TRUE(twice.verified(data_loss("block 0 differs"), true).retry_next_node);
  twice.restart(t0 + seconds(120));
  twice.work_sent();
  twice.head(200);
  twice.first_token(t0, t0 + seconds(32));
  twice.kv_sent();
  twice.landed_now();
  const ImportActions last = twice.verified(data_loss("block 1 differs"), false);
  ASSERT_TRUE(last.report_failure.has_value());
  EXPECT_EQ(last.report_failure->code(), StatusCode::kDataLoss);
  EXPECT_EQ(twice.state(), ImportState::kReleased);
}

TEST(RemotePrefillState, WithChecksumsAStreamEndingWithoutKvSentFailsClosed) {
  RemotePrefillState s = streaming(/*verify_checksums=*/true);
  EXPECT_TRUE(nothing(s.landed_now()));
  const ImportActions a = s.call_ended(Status::ok_status(), false, t0);
  ASSERT_TRUE(a.report_failure.has_value());
  EXPECT_FALSE(a.report_ready);
  EXPECT_FALSE(a.verify);
  EXPECT_EQ(s.state(), ImportState::kReleased);
  // Without checksums the same exchange is ready (the completion message is proof enough).
  RemotePrefillState plain = streaming();
  plain.landed_now();
  EXPECT_TRUE(plain.call_ended(Status::ok_status(), false, t0).report_ready);
}

TEST(RemotePrefillState, ACancelWhileVerifyingReleasesAndTheVerdictIsIgnored) {
  RemotePrefillState s = streaming(/*verify_checksums=*/true);
  s.kv_sent();
  ASSERT_TRUE(s.landed_now().verify);
  const ImportActions a = s.cancel(cancelled("the client left"), t0);
  ASSERT_TRUE(a.report_failure.has_value());
  EXPECT_FALSE(a.send_cancel) << "the KV has landed: nothing to stop";
  EXPECT_EQ(s.state(), ImportState::kReleased);
  EXPECT_TRUE(nothing(s.verified(Status::ok_status(), false)));
}

// Item 6: a client that leaves before its KV lands. The prefill node is told and the call is
// kept open; its kv_failed (or error event, or the completion message) frees the blocks at
// once, not after the transfer timeout plus grace.
TEST(RemotePrefillState, CancelledByTheClientTellsThePrefillNodeAndFreesOnItsConfirmation) {
  for (int confirmation = 0; confirmation < 4; ++confirmation) {
    RemotePrefillState s = confirmation == 3 ? fresh() : streaming();
    if (confirmation == 3) {
      s.work_sent();
      s.head(200);  // still prefilling: no first token yet
    }
    const ImportActions a = s.cancel(cancelled("the client left"), t0);
    ASSERT_TRUE(a.report_failure.has_value());
    EXPECT_EQ(a.report_failure->code(), StatusCode::kCancelled);
    EXPECT_TRUE(a.send_cancel);
    EXPECT_FALSE(a.cancel_call) << "the event stream carries the confirmation";
    EXPECT_EQ(s.state(), ImportState::kCancelling);
    EXPECT_FALSE(s.releasable(t0 + seconds(1)));
    EXPECT_TRUE(s.releasable(t0 + kHold)) << "the hold deadline still bounds it";
    ImportActions confirmed;
    switch (confirmation) {
      case 0:
        confirmed = s.prefill_ended_without_kv(unavailable("kv_failed: cancelled"));
        break;
      case 1:
        confirmed = s.landed_now();  // the export had finished: every put has landed
        break;
      case 2:
      case 3:
        confirmed = s.prefill_ended_without_kv(unavailable("error: aborted"));
        break;
    }
    EXPECT_FALSE(confirmed.report_failure) << "reported once";
    EXPECT_FALSE(confirmed.report_ready);
    EXPECT_EQ(s.state(), ImportState::kReleased) << confirmation;
    EXPECT_TRUE(s.releasable(t0));
  }
}

TEST(RemotePrefillState, CancelledWithoutConfirmationHoldsUntilTheDeadline) {
  RemotePrefillState s = streaming();
  EXPECT_TRUE(s.cancel(cancelled("the client left"), t0).send_cancel);
  // The stream ends without kv_failed (e.g. the prefill node died): nobody can confirm.
  EXPECT_TRUE(nothing(s.call_ended(unavailable("reset"), false, t0 + seconds(1))));
  EXPECT_EQ(s.state(), ImportState::kCancelling);
  EXPECT_FALSE(s.releasable(t0 + kHold - seconds(1)));
  EXPECT_TRUE(s.releasable(t0 + kHold));
}

TEST(RemotePrefillState, CancelledWhileConnectingClosesTheCallAndFreesWhenNothingWasSent) {
  RemotePrefillState s = fresh();
  const ImportActions a = s.cancel(cancelled("the client left"), t0);
  EXPECT_TRUE(a.cancel_call);
  EXPECT_FALSE(a.send_cancel);
  EXPECT_EQ(s.state(), ImportState::kCancelling);
  EXPECT_FALSE(s.releasable(t0));
  EXPECT_TRUE(nothing(s.call_ended(cancelled("call cancelled"), true, t0)));
  EXPECT_EQ(s.state(), ImportState::kReleased);

  // The close raced the send: the work went out after all; drop it there and hold (until the
  // cancel's settled answer: ACancelThatRacedTheWorksSendIsConfirmedByTheSettledCancelAnswer).
  RemotePrefillState raced = fresh();
  EXPECT_TRUE(raced.cancel(cancelled("the client left"), t0).cancel_call);
  EXPECT_TRUE(raced.work_sent().send_cancel);
  raced.call_ended(cancelled("call cancelled"), true, t0);
  EXPECT_EQ(raced.state(), ImportState::kCancelling);
  EXPECT_FALSE(raced.releasable(t0 + seconds(1)));
  EXPECT_TRUE(raced.releasable(t0 + kHold));
}

// Issue #34 item 3: the client left while the work was going out. The call is closed, but its
// bytes went out anyway, so the prefill node may run the work and only the cancel can reach it;
// its settled answer (the work ended there, or never ran and will be refused) is the
// confirmation. Before it, the blocks stayed held until the hold deadline.
TEST(RemotePrefillState, ACancelThatRacedTheWorksSendIsConfirmedByTheSettledCancelAnswer) {
  RemotePrefillState s = fresh();
  EXPECT_TRUE(s.cancel(cancelled("the client left"), t0).cancel_call);
  EXPECT_TRUE(s.work_sent().send_cancel);
  EXPECT_TRUE(nothing(s.call_ended(cancelled("call cancelled"), false, t0)));
  EXPECT_EQ(s.state(), ImportState::kCancelling);
  EXPECT_FALSE(s.releasable(t0 + seconds(1))) << "the work may be running: a put may land";
  EXPECT_TRUE(nothing(s.prefill_settled()));
  EXPECT_EQ(s.state(), ImportState::kReleased);
  EXPECT_TRUE(s.releasable(t0));
  EXPECT_FALSE(s.hold_expired(t0 + kHold)) << "confirmed: the hold did not run out";
}

// The settled answer confirms in either held state, and means nothing outside them (a cancel
// is sent only once the import was given up).
TEST(RemotePrefillState, ASettledCancelAnswerConfirmsOnlyWhereTheImportIsHeld) {
  RemotePrefillState cancelling = streaming();
  EXPECT_TRUE(cancelling.cancel(cancelled("the client left"), t0).send_cancel);
  cancelling.prefill_settled();
  EXPECT_EQ(cancelling.state(), ImportState::kReleased);

  RemotePrefillState failed = fresh();
  failed.work_sent();
  failed.head(200);
  EXPECT_TRUE(failed.fail(deadline_exceeded("no first token"), t0 + seconds(61)).send_cancel);
  EXPECT_EQ(failed.state(), ImportState::kFailed);
  failed.prefill_settled();
  EXPECT_EQ(failed.state(), ImportState::kReleased);

  RemotePrefillState working = streaming();
  EXPECT_TRUE(nothing(working.prefill_settled()));
  EXPECT_EQ(working.state(), ImportState::kFirstToken);
  EXPECT_FALSE(working.releasable(t0));
}

// Blocks freed by the hold deadline, not by a confirmation, are told apart (the client logs
// and counts them), with what gave the import up.
TEST(RemotePrefillState, AHoldThatRunsOutIsToldApartWithItsReason) {
  RemotePrefillState s = streaming();
  EXPECT_TRUE(s.hold_reason().ok());
  s.cancel(cancelled("the client left"), t0);
  s.fail(unavailable("later failure"), t0 + seconds(1));  // already given up: no new reason
  EXPECT_EQ(s.hold_reason().code(), StatusCode::kCancelled);
  EXPECT_NE(s.hold_reason().message().find("the client left"), std::string::npos);
  EXPECT_FALSE(s.hold_expired(t0 + kHold - seconds(1)));
  EXPECT_TRUE(s.hold_expired(t0 + kHold));
  EXPECT_TRUE(s.releasable(t0 + kHold));

  RemotePrefillState ready = streaming();
  ready.kv_sent();
  ready.landed_now();
  EXPECT_FALSE(ready.hold_expired(t0 + kHold * 2));
}

TEST(RemotePrefillState, CancelledAfterTheKvLandedFreesAtOnce) {
  RemotePrefillState s = streaming();
  s.landed_now();  // no kv_sent yet: not ready
  EXPECT_EQ(s.state(), ImportState::kFirstToken);
  const ImportActions a = s.cancel(cancelled("stop string"), t0);
  EXPECT_TRUE(a.report_failure.has_value());
  EXPECT_FALSE(a.send_cancel);
  EXPECT_EQ(s.state(), ImportState::kReleased);
}

// Item 7: the call fails before the head. Only when nothing was sent (connection refused,
// resolve or connect failed) are the blocks free at once, and only then may another prefill
// node take the work; once the body may have gone out, they are held.
TEST(RemotePrefillState, TransportFailureBeforeTheHeadFreesOnlyWhenNothingWasSent) {
  RemotePrefillState refused = fresh();
  const ImportActions retry = refused.call_ended(unavailable("connect: refused"), true, t0);
  EXPECT_TRUE(retry.retry_next_node);
  EXPECT_FALSE(retry.report_failure);
  refused.restart(t0 + seconds(10));
  EXPECT_EQ(refused.state(), ImportState::kPosting);
  const ImportActions last = refused.call_ended(unavailable("connect: refused"), false, t0);
  ASSERT_TRUE(last.report_failure.has_value());
  EXPECT_EQ(refused.state(), ImportState::kReleased);
  EXPECT_TRUE(refused.releasable(t0));

  for (const Status& failure :
       {deadline_exceeded("read the response head: deadline exceeded"),
        unavailable("read the response head: connection reset by peer")}) {
    RemotePrefillState sent = fresh();
    sent.work_sent();
    const ImportActions a = sent.call_ended(failure, /*another_node=*/true, t0);
    EXPECT_FALSE(a.retry_next_node) << "another node would write into the same blocks";
    ASSERT_TRUE(a.report_failure.has_value());
    EXPECT_EQ(a.report_failure->code(), failure.code());
    EXPECT_EQ(sent.state(), ImportState::kFailed);
    EXPECT_FALSE(sent.releasable(t0 + seconds(1))) << failure.to_string();
    EXPECT_TRUE(sent.releasable(t0 + kHold));
    // A kv_failed cannot come any more (the call is gone), but a completion message can.
    sent.landed_now();
    EXPECT_EQ(sent.state(), ImportState::kReleased);
  }
}

TEST(RemotePrefillState, ARefusalTriesTheNextNodeAndTheLastOneFreesAtOnce) {
  RemotePrefillState s = fresh();
  s.work_sent();
  s.head(503);
  EXPECT_TRUE(s.call_ended(unavailable("HTTP 503"), true, t0).retry_next_node);
  s.restart(t0 + seconds(10));
  s.work_sent();
  s.head(503);
  const ImportActions a = s.call_ended(unavailable("HTTP 503"), false, t0);
  EXPECT_TRUE(a.report_failure.has_value());
  EXPECT_EQ(s.state(), ImportState::kReleased);
}

TEST(RemotePrefillState, DeadlinesAndProtocolErrorsHoldAndAskTheNodeToAbort) {
  RemotePrefillState slow = fresh();
  slow.work_sent();
  slow.head(200);
  EXPECT_FALSE(slow.overdue(t0 + seconds(59)));
  ASSERT_TRUE(slow.overdue(t0 + seconds(61)));
  const ImportActions a = slow.fail(deadline_exceeded("no first token"), t0 + seconds(61));
  EXPECT_TRUE(a.report_failure.has_value());
  EXPECT_TRUE(a.send_cancel);
  EXPECT_EQ(slow.state(), ImportState::kFailed);
  EXPECT_FALSE(slow.overdue(t0 + seconds(62)));
  // A late first token is not reported; the error event confirms.
  EXPECT_FALSE(slow.first_token(t0, t0 + seconds(100)).report_first_token);
  slow.prefill_ended_without_kv(unavailable("aborted"));
  EXPECT_EQ(slow.state(), ImportState::kReleased);

  // No head by the deadline and nothing sent: close the call; its end frees the blocks.
  RemotePrefillState connecting = fresh();
  EXPECT_TRUE(connecting.fail(deadline_exceeded("late"), t0 + seconds(61)).cancel_call);
  connecting.call_ended(cancelled("closed"), true, t0 + seconds(61));
  EXPECT_EQ(connecting.state(), ImportState::kReleased);

  RemotePrefillState twice = streaming();
  const ImportActions second = twice.first_token(t0, t0 + seconds(32));
  EXPECT_TRUE(second.report_failure.has_value());
  EXPECT_FALSE(second.report_first_token);
  EXPECT_EQ(twice.state(), ImportState::kFailed);

  // Accepted, then the stream ended without a first token: held.
  RemotePrefillState empty = fresh();
  empty.work_sent();
  empty.head(200);
  EXPECT_TRUE(empty.call_ended(unavailable("no first token"), true, t0).report_failure);
  EXPECT_EQ(empty.state(), ImportState::kFailed);
  EXPECT_FALSE(empty.releasable(t0 + seconds(1)));
}

TEST(RemotePrefillState, AKvFailedReportsTheFailureAndFreesAtOnce) {
  RemotePrefillState s = streaming();
  const ImportActions a = s.prefill_ended_without_kv(unavailable("kv_failed: peer failed"));
  EXPECT_TRUE(a.report_failure.has_value());
  EXPECT_EQ(s.state(), ImportState::kReleased);
  EXPECT_TRUE(s.releasable(t0));
  EXPECT_STREQ(import_state_name(s.state()), "released");
}

}  // namespace
}  // namespace pdserve::kv_transfer
