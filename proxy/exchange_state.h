// The lifecycle of one client request the proxy forwards to decode nodes (issue #29 item 3): an
// explicit state machine that decides, from what the decode node's call reports, what the
// proxy must do and how the client's answer ends. No sockets, no metrics: ProxyServer
// (proxy_server.cpp) feeds ExchangeLifecycle events and carries out the returned actions;
// tests/proxy/exchange_state_test.cpp drives it as a fake node would.
//
//   kRouting ──call_started──> kAwaitingHead ──head──┬──> kStreaming   an SSE stream: relayed
//    ^  │                          │                  ├──> kBuffering   a whole answer: read
//    │  │                          │                  ├──> kRefused     429/503, another try
//    │  │                          │                  │                 left: the body is why
//    │  │                          │                  └──> kDiscarding  a resumption answered
//    │  │                          │                                    without a stream
//    │  │                          └── call ended without a head (node gone) ──┐
//    │  │           kRefused ── call ended whole (the next node is tried) ─────┤
//    │  │           kStreaming ── cut, what the client has can be resumed ─────┤
//    └──┼───────────────────────────────────────────────── route_again ───────┘
//       └── no node left, or the resumption's body cannot be made ──> kDone (an error)
//   kStreaming / kBuffering / kDiscarding / kRefused ── call ended ──> kDone (answer or error)
//   any state ── client_left / client_write_failed ──> kDone (nothing sent; the call is
//   cancelled, and its end is not the node's failure)
//
// The client's stream, once opened (the first stream head), stays open across resumptions:
// from then on every failure is an error event in it and never an HTTP error.
#pragma once

namespace pdserve::proxy {

enum class ExchangeState {
  kRouting,       // choosing a decode node: before the first call, or between calls
  kAwaitingHead,  // a call is out; no answer head yet
  kRefused,       // the node refused (429/503) and another may be tried: its body is the reason
  kBuffering,     // reading a whole answer, relayed when it is complete
  kStreaming,     // relaying the node's stream to the client
  kDiscarding,    // a resumption answered with something else than a stream: the body is dropped
  kDone,          // the client has its answer or error, or left
};

const char* exchange_state_name(ExchangeState state);

// How the client's answer ends (ExchangeActions::end).
enum class ExchangeEnd {
  kNone,              // not now
  kAnswer,            // the node's answer: the rest of its stream, or its whole body
  kContentless,       // 502: the node answered 204, 205 or 304
  kNodeFailed,        // the node failed mid-answer: 503, or an error event in the client's stream
  kNoNode,            // no decode node could take it: 503 (with the last refusal's body if any)
  kAllBusy,           // no decode node could take it and one was full: 429
  kNoNodeToResume,    // error event: no decode node could continue the client's stream
  kResumeUnreadable,  // error event: the resumption's body could not be made
  kResumeRefused,     // error event: the node asked to continue the stream did not
  kEventTooLarge,     // error event: the node sent an SSE event over the relay's bound
  kAnswerTooLarge,    // 502: a whole (non-streamed) answer over the proxy's bound
};

// What the proxy must do after an event (several may be set).
struct ExchangeActions {
  bool open_client_stream = false;  // start the client's stream with the node's head
  bool cancel_call = false;         // cancel the call in flight
  bool route_again = false;         // try the next decode node (with a resumption once open)
  bool keep_refusal = false;        // the refusal's body (a 503's) becomes the last refusal
  bool count_retry = false;         // the request goes to another node after a refusal
  bool node_failed = false;         // mark the node down and count an upstream failure
  bool count_resume = false;        // the client's stream goes on on another node
  ExchangeEnd end = ExchangeEnd::kNone;

  bool operator==(const ExchangeActions&) const = default;
};

// What to do with bytes of the answer's body.
enum class BodyUse {
  kIgnore,   // the client left or has its answer
  kRefusal,  // keep (its first bytes) as the refusal's reason
  kDrop,     // a refused resumption's body: not the client's
  kBuffer,   // part of a whole answer
  kRelay,    // through the SSE relay to the client's stream
};

struct BodyAction {
  BodyUse use = BodyUse::kIgnore;
  bool first_byte = false;  // the first byte of an answer: time to first byte is measured now

  bool operator==(const BodyAction&) const = default;
};

// The answer head of the node's call.
struct NodeHead {
  int status = 0;
  bool event_stream = false;  // Content-Type text/event-stream
  bool contentless = false;   // 204, 205 or 304: no body by definition
  bool can_retry = false;     // another decode node may be tried after this one
};

class ExchangeLifecycle {
 public:
  ExchangeState state() const { return state_; }
  bool done() const { return state_ == ExchangeState::kDone; }
  // A call is out (its end is still to come).
  bool calling() const;
  // The client has the stream's head: the next call continues it (a resumption).
  bool client_stream_open() const { return client_stream_open_; }
  // A decode node answered 429 (full) on some try.
  bool busy() const { return busy_; }
  // The status of the current call's head; 0 before it.
  int status() const { return status_; }

  // ---- events ------------------------------------------------------------------------------
  // No decode node is left to try (none up, all tried, or the tries used up).
  ExchangeActions no_node();
  // The body that continues the client's stream could not be made.
  ExchangeActions resume_unreadable();
  // A call to a decode node went out.
  void call_started();
  ExchangeActions head(const NodeHead& head);
  BodyAction body();
  // The SSE relay held more than its bound: the stream is cut.
  ExchangeActions relay_overflowed();
  // A whole answer being buffered grew over the proxy's bound: it is refused, not relayed.
  ExchangeActions buffer_overflowed();
  // The client's stream did not take the relayed bytes (gone, or not keeping up).
  ExchangeActions client_write_failed();
  // The call ended: `ok` when the answer came whole; `resumable` when what the client got of
  // the stream can be continued on another node (SseRelay's DeliveredStream).
  ExchangeActions call_ended(bool ok, bool resumable);
  ExchangeActions client_left();

 private:
  ExchangeActions finish(ExchangeEnd end);
  // The node failed after its head: resume the stream elsewhere, or end with kNodeFailed.
  ExchangeActions failed_mid_answer(bool resumable);

  ExchangeState state_ = ExchangeState::kRouting;
  int status_ = 0;
  bool client_stream_open_ = false;
  bool contentless_ = false;  // the current call's head
  bool busy_ = false;
  bool first_byte_ = false;
};

}  // namespace pdserve::proxy
