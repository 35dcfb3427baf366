#include "prefill_node/prefill_exchange_state.h"

namespace pdserve {

const char* exchange_state_name(ExchangeState state) {
  switch (state) {
    case ExchangeState::kAdmitting:
      return "admitting";
    case ExchangeState::kPrefilling:
      return "prefilling";
    case ExchangeState::kExporting:
      return "exporting";
    case ExchangeState::kKvHeld:
      return "kv_held";
    case ExchangeState::kErrorHeld:
      return "error_held";
    case ExchangeState::kTokenSent:
      return "token_sent";
    case ExchangeState::kTokenSentExporting:
      return "token_sent_exporting";
    case ExchangeState::kEnded:
      return "ended";
  }
  return "?";
}

ExchangeActions PrefillExchangeState::end(LastEvent last) {
  state_ = ExchangeState::kEnded;
  ExchangeActions actions;
  actions.last = last;
  actions.finish_work = true;
  return actions;
}

ExchangeActions PrefillExchangeState::admitted() {
  if (state_ == ExchangeState::kAdmitting) state_ = ExchangeState::kPrefilling;
  return {};
}

ExchangeActions PrefillExchangeState::cancelled_before_arrival() {
  if (state_ == ExchangeState::kAdmitting) state_ = ExchangeState::kEnded;
  return {};  // never listed: nothing to forget, no cancel to answer
}

ExchangeActions PrefillExchangeState::submit_failed() {
  if (state_ != ExchangeState::kAdmitting) return {};
  return end(LastEvent::kNone);  // no stream: the server answers with the error
}

ExchangeActions PrefillExchangeState::export_started() {
  switch (state_) {
    case ExchangeState::kPrefilling:
      state_ = ExchangeState::kExporting;
      break;
    case ExchangeState::kTokenSent:
      state_ = ExchangeState::kTokenSentExporting;
      break;
    default:
      break;
  }
  return {};
}

ExchangeActions PrefillExchangeState::first_token() {
  ExchangeActions actions;
  switch (state_) {
    case ExchangeState::kPrefilling:
      state_ = ExchangeState::kTokenSent;
      actions.write_first_token = true;
      return actions;
    case ExchangeState::kExporting:
    case ExchangeState::kErrorHeld:  // the held error is moot once the token is out
      state_ = ExchangeState::kTokenSentExporting;
      actions.write_first_token = true;
      return actions;
    case ExchangeState::kKvHeld:
      actions = end(LastEvent::kReport);
      actions.write_first_token = true;
      return actions;
    default:
      return actions;  // not admitted, a second token, or over
  }
}

ExchangeActions PrefillExchangeState::prefill_failed() {
  ExchangeActions actions;
  switch (state_) {
    case ExchangeState::kPrefilling:
    case ExchangeState::kTokenSent:
    case ExchangeState::kKvHeld:  // the export has ended: no put can land
      return end(LastEvent::kError);
    case ExchangeState::kExporting:
    case ExchangeState::kErrorHeld:  // the latest error is the one written
      // The decode node frees its blocks on the last event: it must come after the export.
      state_ = ExchangeState::kErrorHeld;
      actions.hold_error = true;
      return actions;
    default:
      return actions;  // the transfer's report ends kTokenSentExporting
  }
}

ExchangeActions PrefillExchangeState::kv_reported() {
  ExchangeActions actions;
  switch (state_) {
    case ExchangeState::kPrefilling:
    case ExchangeState::kExporting:
      state_ = ExchangeState::kKvHeld;
      actions.hold_report = true;
      return actions;
    case ExchangeState::kTokenSent:
    case ExchangeState::kTokenSentExporting:
      return end(LastEvent::kReport);
    case ExchangeState::kErrorHeld:
      return end(LastEvent::kHeldError);
    default:
      return actions;
  }
}

ExchangeActions PrefillExchangeState::cancel() {
  ExchangeActions actions;
  if (state_ == ExchangeState::kEnded) {
    actions.answer_cancel = true;
    return actions;
  }
  // The engine aborts the request: an error event when it had not exported yet. An export
  // already under way ends as it would have (kv_sent, or kv_failed once no put can land).
  actions.keep_cancel = true;
  actions.abort_engine = true;
  return actions;
}

ExchangeActions PrefillExchangeState::client_gone() {
  ExchangeActions actions;
  actions.abort_engine = true;  // the abort of a finished request is a no-op
  return actions;
}

}  // namespace pdserve
