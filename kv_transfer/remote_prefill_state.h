// The decode side's view of one remote prefill (an import): an explicit state machine that
// decides, from what the transport reports, what the connector must do and — the point of it —
// when the request's reserved blocks may be freed: only once no put of the prefill node can
// still land in them. No UCX, no HTTP: the connector (ucx_kv_connector.cpp) feeds it events
// and carries out the returned actions; tests/kv_transfer/remote_prefill_state_test.cpp drives
// it as a fake transport would.
//
//   kPosting ──work_sent──> kPosted ──head 200──> kPrefilling ──first_token──> kFirstToken
//      │                      │                       │                          │
//      │ call ends, nothing   │ call ends before      │                          │ landed (+ kv_sent
//      │ sent: next node or   │ the head: the node    │                          │ or stream end)
//      │ kReleased            │ may be writing:       v                          v
//      │                      └──────────────> kFailed (held)                 kReady (released)
//      │
//   With checksums (verify_checksums): landed + kv_sent ──> kVerifying: the connector compares
//      the blocks as they landed with the checksums of kv_sent; verified(ok) ──> kReady;
//      verified(mismatch) with another prefill node ──> retry_next_node, restart() ──> kPosting
//      (a re-fetch: nothing can land after the completion message, so the next node may write
//      the same blocks; its first token is not reported again); without one ──> kReleased with
//      the failure reported, and the engine prefills the request itself. A stream that ends
//      without kv_sent has no checksums: it fails closed the same way.
//   any state before kReady ──client cancel──> kCancelling: the prefill node is told (cancel
//      call; the event stream stays open), or, when nothing was sent yet, the call is closed.
//   kCancelling / kFailed ──confirmation──> kReleased. A confirmation is one of: kv_failed or an
//      error event (the prefill node ended the export, or never started one), the completion
//      message (it follows every put), a non-200 answer (the work was refused), a call that
//      ended before anything was sent, or the prefill node's settled answer to the cancel (the
//      work has ended there, or never ran and will be refused: it also reaches a decode node
//      whose work call was closed while its bytes went out). Without one, the blocks are
//      released at the hold deadline (the transfer's timeout plus a grace period after the
//      failure): hold_expired().
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "common/core/status.h"

namespace pdserve::kv_transfer {

enum class ImportState {
  kPosting,     // the PrefillWork is being sent; nothing has reached the prefill node
  kPosted,      // the request went out: the prefill node may be working on it
  kPrefilling,  // the prefill node accepted the work (200)
  kFirstToken,  // the first token is here; the KV is on its way
  kVerifying,   // the KV landed with its checksums; the connector is comparing them
  kReady,       // the KV landed and was reported: the blocks are the sequence's
  kCancelling,  // the client left; waiting for the prefill node's confirmation or the deadline
  kFailed,      // failed while a put may still land; held until confirmation or the deadline
  kReleased,    // no put can land any more: the blocks may be freed
};

const char* import_state_name(ImportState state);

// What the connector must do after an event (several may be set).
struct ImportActions {
  bool report_first_token = false;       // kFirstToken to the engine
  bool report_ready = false;             // kImportReady
  std::optional<Status> report_failure;  // kImportFailed, with why
  bool retry_next_node = false;          // post the work to the next prefill node
  bool send_cancel = false;              // ask the prefill node to abort this work
  bool cancel_call = false;              // close the HTTP call
  bool verify = false;                   // compare the landed blocks with kv_sent's checksums
};

class RemotePrefillState {
 public:
  using Clock = std::chrono::steady_clock;

  // `deadline`: for the first token (then, from it, for the KV); `hold`: how long blocks are
  // held after a failure without confirmation (the transfer timeout plus a grace period);
  // `verify_checksums`: the KV is ready only once its checksums are verified (kVerifying).
  RemotePrefillState(Clock::time_point deadline, Clock::duration hold,
                     bool verify_checksums = false);

  ImportState state() const { return state_; }
  // Ready or failed was reported (the engine has its outcome).
  bool reported() const { return reported_; }
  bool landed() const { return landed_; }
  bool first_token_received() const { return first_token_; }
  // Whether the blocks may be freed now (kReady, kReleased, or the hold deadline passed).
  bool releasable(Clock::time_point now) const;
  // Releasable only because the hold deadline passed: nothing confirmed that no put can land.
  bool hold_expired(Clock::time_point now) const;
  // Why the blocks are held (what gave the import up); OK before that.
  const Status& hold_reason() const { return hold_reason_; }
  Clock::time_point deadline() const { return deadline_; }

  // ---- transport events -------------------------------------------------------------------
  // The request's bytes start to go out (the connection is up): from now on the prefill node
  // may receive the work.
  ImportActions work_sent();
  // The answer's head.
  ImportActions head(int http_status);
  // The first token; `kv_deadline`: the deadline for the KV from now. A second one is a
  // protocol error.
  ImportActions first_token(Clock::time_point now, Clock::time_point kv_deadline);
  ImportActions kv_sent();
  // The prefill node reported kv_failed, or an error event: no put of it can still land.
  ImportActions prefill_ended_without_kv(const Status& why);
  // The transfer's completion message arrived (every put of it has landed).
  ImportActions landed_now();
  // The prefill node answered a cancel (after send_cancel) only once no put of the work can land
  // any more: it ended there, or never ran and will be refused.
  ImportActions prefill_settled();
  // The connector compared the landed blocks with their checksums (after `verify`): OK, or
  // why not (DataLoss for a mismatch). `another_node`: a further prefill node could send the
  // KV again. Ignored outside kVerifying.
  ImportActions verified(const Status& outcome, bool another_node);
  // The HTTP call ended. `why`: what to report if that is a failure here (a refusal, the
  // transport's error, or a stream without a first token). `another_node`: a further prefill
  // node could take the work.
  ImportActions call_ended(const Status& why, bool another_node, Clock::time_point now);
  // The engine no longer wants the request (its client left, a stop string in the first token).
  ImportActions cancel(const Status& why, Clock::time_point now);
  // A failure seen here: a malformed event, a protocol violation, the deadline (overdue()).
  ImportActions fail(const Status& why, Clock::time_point now);
  // Past the deadline without an outcome.
  bool overdue(Clock::time_point now) const;
  // The work goes to the next prefill node (after retry_next_node): back to kPosting, with
  // `deadline` for its first token.
  void restart(Clock::time_point deadline);
  // The current exchange re-fetches KV whose checksums did not match: its first token is not
  // reported (the engine has one).
  bool refetching() const { return refetching_; }

 private:
  bool refused() const { return http_status_ != 0 && http_status_ != 200; }
  void report_failure(ImportActions& actions, const Status& why);
  void maybe_ready(ImportActions& actions);
  ImportActions give_up(ImportState to, const Status& why, Clock::time_point now);
  // give_up(next), unless the import already landed or was given up (then nothing to do).
  ImportActions give_up_unless_over(ImportState next, const Status& why, Clock::time_point now);

  ImportState state_ = ImportState::kPosting;
  Clock::time_point deadline_;
  Clock::duration hold_;
  std::optional<Clock::time_point> release_at_;
  Status hold_reason_;
  int http_status_ = 0;
  bool sent_ = false;         // work_sent() was seen for the current call
  bool first_token_ = false;  // a first token arrived
  bool kv_sent_ = false;      // the prefill node reported the transfer done
  bool stream_ended_ = false;
  bool landed_ = false;
  bool reported_ = false;
  bool verify_checksums_ = false;
  bool refetching_ = false;
};

}  // namespace pdserve::kv_transfer
