// PrefillExchangeState (issue #29 item 3): every transition of a prefill work on the prefill
// node, driven as the engine, the KV transfer and the decode node would. The property that
// must hold throughout: the last event (which a decode node takes as "no put of this work can
// land any more") never comes while an export that started has not reported, and the first
// token always precedes the transfer's event.
#include "prefill_node/prefill_exchange_state.h"

#include <gtest/gtest.h>

#include <string>

namespace pdserve {
namespace {

PrefillExchangeState admitted() {
  PrefillExchangeState exchange;
  const ExchangeActions actions = exchange.admitted();
  EXPECT_EQ(exchange.state(), ExchangeState::kPrefilling);
  EXPECT_FALSE(actions.finish_work);
  return exchange;
}

void expect_ended_with(const ExchangeActions& actions, LastEvent last) {
  EXPECT_EQ(actions.last, last);
  EXPECT_TRUE(actions.finish_work);
}

TEST(PrefillExchangeState, WorkReceivedThenTokenThenKvSent) {
  PrefillExchangeState exchange = admitted();
  ExchangeActions actions = exchange.first_token();
  EXPECT_TRUE(actions.write_first_token);
  EXPECT_EQ(actions.last, LastEvent::kNone);
  EXPECT_EQ(exchange.state(), ExchangeState::kTokenSent);
  EXPECT_EQ(exchange.export_started().last, LastEvent::kNone);
  EXPECT_EQ(exchange.state(), ExchangeState::kTokenSentExporting);
  actions = exchange.kv_reported();
  expect_ended_with(actions, LastEvent::kReport);
  EXPECT_FALSE(actions.write_first_token);
  EXPECT_TRUE(exchange.ended());
}

TEST(PrefillExchangeState, LayerwiseExportStartsBeforeTheToken) {
  PrefillExchangeState exchange = admitted();
  exchange.export_started();
  EXPECT_EQ(exchange.state(), ExchangeState::kExporting);
  const ExchangeActions token = exchange.first_token();
  EXPECT_TRUE(token.write_first_token);
  EXPECT_FALSE(token.finish_work);
  EXPECT_EQ(exchange.state(), ExchangeState::kTokenSentExporting);
  expect_ended_with(exchange.kv_reported(), LastEvent::kReport);
}

TEST(PrefillExchangeState, AReportBeforeTheTokenWaitsAndFollowsIt) {
  for (bool started : {false, true}) {
    PrefillExchangeState exchange = admitted();
    if (started) exchange.export_started();
    ExchangeActions actions = exchange.kv_reported();
    EXPECT_TRUE(actions.hold_report);
    EXPECT_EQ(actions.last, LastEvent::kNone);
    EXPECT_FALSE(actions.finish_work);
    EXPECT_EQ(exchange.state(), ExchangeState::kKvHeld);
    actions = exchange.first_token();
    EXPECT_TRUE(actions.write_first_token);          // first ...
    expect_ended_with(actions, LastEvent::kReport);  // ... then the held report
  }
}

TEST(PrefillExchangeState, AFailureBeforeTheExportEndsAtOnce) {
  PrefillExchangeState exchange = admitted();
  expect_ended_with(exchange.prefill_failed(), LastEvent::kError);
  // A report of the export that never started changes nothing any more.
  const ExchangeActions late = exchange.kv_reported();
  EXPECT_EQ(late.last, LastEvent::kNone);
  EXPECT_FALSE(late.finish_work);
  EXPECT_FALSE(exchange.first_token().write_first_token);
}

TEST(PrefillExchangeState, AFailureDuringTheExportWaitsForItsEnd) {
  PrefillExchangeState exchange = admitted();
  exchange.export_started();
  ExchangeActions actions = exchange.prefill_failed();
  EXPECT_TRUE(actions.hold_error);
  EXPECT_FALSE(actions.finish_work);
  EXPECT_EQ(exchange.state(), ExchangeState::kErrorHeld);
  EXPECT_TRUE(exchange.prefill_failed().hold_error);  // the latest error is the one written
  expect_ended_with(exchange.kv_reported(), LastEvent::kHeldError);
}

TEST(PrefillExchangeState, ATokenAfterAHeldErrorLetsTheReportEndTheWork) {
  PrefillExchangeState exchange = admitted();
  exchange.export_started();
  exchange.prefill_failed();
  EXPECT_TRUE(exchange.first_token().write_first_token);
  EXPECT_EQ(exchange.state(), ExchangeState::kTokenSentExporting);
  expect_ended_with(exchange.kv_reported(), LastEvent::kReport);
}

TEST(PrefillExchangeState, AFailureAfterTheTokenEndsAtOnceOnlyWithoutAnExport) {
  PrefillExchangeState idle = admitted();
  idle.first_token();
  expect_ended_with(idle.prefill_failed(), LastEvent::kError);

  PrefillExchangeState exporting = admitted();
  exporting.first_token();
  exporting.export_started();
  const ExchangeActions ignored = exporting.prefill_failed();
  EXPECT_EQ(ignored.last, LastEvent::kNone);
  EXPECT_FALSE(ignored.finish_work);
  EXPECT_EQ(exporting.state(), ExchangeState::kTokenSentExporting);
  expect_ended_with(exporting.kv_reported(), LastEvent::kReport);
}

TEST(PrefillExchangeState, AFailureWithAHeldReportEndsWithTheError) {
  PrefillExchangeState exchange = admitted();
  exchange.kv_reported();
  expect_ended_with(exchange.prefill_failed(), LastEvent::kError);
}

TEST(PrefillExchangeState, TheTransfersDeadlineIsAFailedReport) {
  // No deadline of the node's own: the transfer's ends a stuck export with a failed report,
  // before or after the token.
  PrefillExchangeState before = admitted();
  before.export_started();
  EXPECT_TRUE(before.kv_reported().hold_report);
  expect_ended_with(before.first_token(), LastEvent::kReport);

  PrefillExchangeState after = admitted();
  after.first_token();
  after.export_started();
  expect_ended_with(after.kv_reported(), LastEvent::kReport);
}

TEST(PrefillExchangeState, ACancelBeforeThePutAbortsAndIsAnsweredAtTheEnd) {
  PrefillExchangeState exchange = admitted();
  ExchangeActions cancel = exchange.cancel();
  EXPECT_TRUE(cancel.abort_engine);
  EXPECT_TRUE(cancel.keep_cancel);
  EXPECT_FALSE(cancel.answer_cancel);
  EXPECT_EQ(exchange.state(), ExchangeState::kPrefilling);
  // The engine's abort comes back as an error: the work ends, and the kept cancel with it.
  expect_ended_with(exchange.prefill_failed(), LastEvent::kError);
  cancel = exchange.cancel();
  EXPECT_TRUE(cancel.answer_cancel);
  EXPECT_FALSE(cancel.abort_engine);
  EXPECT_FALSE(cancel.keep_cancel);
}

TEST(PrefillExchangeState, ACancelDuringThePutWaitsForTheExportsEnd) {
  PrefillExchangeState exchange = admitted();
  exchange.first_token();
  exchange.export_started();
  const ExchangeActions cancel = exchange.cancel();
  EXPECT_TRUE(cancel.keep_cancel);
  EXPECT_TRUE(cancel.abort_engine);
  EXPECT_FALSE(cancel.answer_cancel);
  // The export ends as it would have (kv_sent, or kv_failed once no put can land).
  expect_ended_with(exchange.kv_reported(), LastEvent::kReport);
}

TEST(PrefillExchangeState, ACancelAfterThePutIsAnsweredAtOnce) {
  PrefillExchangeState exchange = admitted();
  exchange.first_token();
  exchange.kv_reported();
  const ExchangeActions cancel = exchange.cancel();
  EXPECT_TRUE(cancel.answer_cancel);
  EXPECT_FALSE(cancel.keep_cancel);
  EXPECT_FALSE(cancel.abort_engine);
}

TEST(PrefillExchangeState, ClientGoneAbortsTheEngineAndChangesNothingElse) {
  const ExchangeActions actions = PrefillExchangeState::client_gone();
  EXPECT_TRUE(actions.abort_engine);
  EXPECT_FALSE(actions.finish_work);
  EXPECT_EQ(actions.last, LastEvent::kNone);
  EXPECT_FALSE(actions.keep_cancel || actions.answer_cancel);
}

TEST(PrefillExchangeState, WorkCancelledBeforeItArrivedIsNeverListed) {
  PrefillExchangeState exchange;
  const ExchangeActions actions = exchange.cancelled_before_arrival();
  EXPECT_TRUE(exchange.ended());
  EXPECT_FALSE(actions.finish_work);  // not in the work table: nothing to forget or answer
  EXPECT_EQ(actions.last, LastEvent::kNone);
  // Nothing of it runs: later events change nothing.
  EXPECT_EQ(exchange.admitted().last, LastEvent::kNone);
  EXPECT_TRUE(exchange.ended());
}

TEST(PrefillExchangeState, WorkTheEngineRefusedIsForgottenWithoutAStream) {
  PrefillExchangeState exchange;
  const ExchangeActions actions = exchange.submit_failed();
  EXPECT_TRUE(exchange.ended());
  EXPECT_TRUE(actions.finish_work);  // it was listed: forgotten, its cancels answered
  EXPECT_EQ(actions.last, LastEvent::kNone);
}

TEST(PrefillExchangeState, NothingIsWrittenAfterTheEnd) {
  PrefillExchangeState exchange = admitted();
  exchange.first_token();
  exchange.kv_reported();
  for (const ExchangeActions& actions :
       {exchange.first_token(), exchange.prefill_failed(), exchange.kv_reported(),
        exchange.export_started(), exchange.admitted(), exchange.submit_failed()}) {
    EXPECT_FALSE(actions.write_first_token);
    EXPECT_EQ(actions.last, LastEvent::kNone);
    EXPECT_FALSE(actions.finish_work);
    EXPECT_FALSE(actions.hold_report || actions.hold_error);
  }
  EXPECT_TRUE(exchange.ended());
}

TEST(PrefillExchangeState, ASecondTokenIsNotWritten) {
  PrefillExchangeState exchange = admitted();
  exchange.first_token();
  EXPECT_FALSE(exchange.first_token().write_first_token);
  EXPECT_EQ(exchange.state(), ExchangeState::kTokenSent);
}

TEST(PrefillExchangeState, EveryStateHasAName) {
  for (ExchangeState state :
       {ExchangeState::kAdmitting, ExchangeState::kPrefilling, ExchangeState::kExporting,
        ExchangeState::kKvHeld, ExchangeState::kErrorHeld, ExchangeState::kTokenSent,
        ExchangeState::kTokenSentExporting, ExchangeState::kEnded}) {
    EXPECT_NE(std::string(exchange_state_name(state)), "?");
  }
}

}  // namespace
}  // namespace pdserve
