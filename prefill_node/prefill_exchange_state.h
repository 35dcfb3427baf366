// The prefill node's view of one work (an exchange with a decode node), as an explicit state
// machine: events in from the engine, the KV transfer and the HTTP side, actions out for the
// server (prefill_server.cpp) to carry out. No HTTP, no engine: it only decides what is written
// when, and the point of it is the order: the first_token event precedes the transfer's event,
// though the transfer (on the KV thread) may end before the engine thread delivers the token;
// and the work's last event — which a decode node takes as "no put can land any more" — is
// written only once the export has ended. tests/kv_transfer/prefill_exchange_state_test.cpp
// drives every transition.
//
//   kAdmitting ──admitted──> kPrefilling ──first_token──> kTokenSent ──kv_reported──> kEnded
//      │                       │    │                        │ export_started          (kv_sent
//      │ cancelled_before_     │    │ export_started         v                     or kv_failed)
//      │ arrival / submit_     │    └──> kExporting ──first_token──> kTokenSentExporting
//      │ failed: kEnded        │            │    │                     └──kv_reported──> kEnded
//      │ (no stream)           │            │    └─prefill_failed──> kErrorHeld
//      │                       │            │                          ├─kv_reported──> kEnded
//      │                       │            │                          │   (the error)
//      │                       │            │                          └─first_token──>
//      │                       │            │                            kTokenSentExporting
//      │                       kv_reported  kv_reported
//      │                       v            v
//      │                     kKvHeld (the report waits for the token) ──first_token──> kEnded
//      │                                    └──prefill_failed──> kEnded (the error)
//   prefill_failed in kPrefilling or kTokenSent (no export under way): kEnded with the error.
//   In kTokenSentExporting an error changes nothing: the transfer's report ends the work.
//   cancel (the decode node's cancel call): the engine aborts the work; the answer waits for
//   kEnded (answered at once there). client_gone: the engine aborts the work.
//   There is no deadline of the node's own: the transfer's (the work's timeout_ms) ends a stuck
//   export with a failed report, which is kv_reported like any other.
#pragma once

namespace pdserve {

enum class ExchangeState {
  kAdmitting,           // being submitted to the engine
  kPrefilling,          // the engine computes the prompt; nothing written yet
  kExporting,           // the export started before the first token (layer by layer)
  kKvHeld,              // the transfer ended before the first token: its report waits
  kErrorHeld,           // the prefill failed during the export: the error waits for its end
  kTokenSent,           // first_token written; the export has not started yet
  kTokenSentExporting,  // first_token written; the export is under way
  kEnded,               // the last event is written (or the work was refused)
};

const char* exchange_state_name(ExchangeState state);

// The event that ends the work's stream, if any.
enum class LastEvent {
  kNone,
  kReport,     // kv_sent or kv_failed, from the transfer's report (just arrived, or held)
  kError,      // the error that just arrived
  kHeldError,  // the error held in kErrorHeld
};

// What the server must do after an event (several may be set).
struct ExchangeActions {
  bool write_first_token = false;  // before `last`
  bool hold_report = false;        // keep the report until the first token is written
  bool hold_error = false;         // keep the error until the export ends
  LastEvent last = LastEvent::kNone;
  // The work is over: forget it (cancels no longer find it) and answer the cancels kept.
  bool finish_work = false;
  bool keep_cancel = false;    // answer this cancel when the work ends
  bool answer_cancel = false;  // answer this cancel now: no put of the work can land any more
  bool abort_engine = false;   // the engine drops the request
};

class PrefillExchangeState {
 public:
  ExchangeState state() const { return state_; }
  bool ended() const { return state_ == ExchangeState::kEnded; }

  // ---- admission ---------------------------------------------------------------------------
  ExchangeActions admitted();                  // the engine took the work
  ExchangeActions cancelled_before_arrival();  // a cancel came first: refused, never listed
  ExchangeActions submit_failed();             // listed for cancel, then refused by the engine

  // ---- the engine and the transfer --------------------------------------------------------
  ExchangeActions export_started();  // the transfer's report will come
  ExchangeActions first_token();
  ExchangeActions prefill_failed();
  ExchangeActions kv_reported();  // the transfer ended (ok, refused, failed or timed out)

  // ---- the decode node ----------------------------------------------------------------------
  ExchangeActions cancel();  // its cancel call for this work
  // Its work call closed. Changes nothing here (the engine's abort brings the error, or the
  // export ends as it would have), so it needs no lock: it may run inside admission.
  static ExchangeActions client_gone();

 private:
  ExchangeActions end(LastEvent last);

  ExchangeState state_ = ExchangeState::kAdmitting;
};

}  // namespace pdserve
