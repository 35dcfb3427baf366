// The life of one OpenAI response on its connection, as an explicit state machine: what may be
// written when, and how a failure reaches the client. GenerationStream feeds it the events of
// its engine requests and writes what the returned action says; response_lifecycle_test drives
// it transition by transition.
//
//   kAccepted ──open (stream)──> kStreaming        (the head, 200 text/event-stream)
//      │  open (whole answer): stays kAccepted      (its head goes out with the body)
//      │
//      ├──fail──> kAnswered: an HTTP error response (status and OpenAI error body)
//      └──finish─> kAnswered: the whole answer
//   kStreaming ──fail──> kAnswered: an SSE error event, then [DONE]
//   kStreaming ──finish─> kAnswered: the usage chunk or timeline, then [DONE]
//   kAnswered: every later event is dropped (answer_elsewhere() enters it without writing: the
//              request was refused before any delta could arrive).
#pragma once

namespace pdserve {

enum class ResponsePhase {
  kAccepted,   // nothing written yet
  kStreaming,  // a stream's head is out; events follow
  kAnswered,   // the response is complete (an answer or an error); nothing more is written
};

const char* response_phase_name(ResponsePhase phase);

// How a failure reaches the client.
enum class FailureDelivery {
  kDropped,        // the response is already complete: nothing is written
  kErrorResponse,  // nothing was written: an HTTP error with its status
  kErrorEvent,     // a stream is open: an SSE error event, [DONE], the end of the stream
};

class ResponseLifecycle {
 public:
  explicit ResponseLifecycle(bool stream) : stream_(stream) {}

  ResponsePhase phase() const { return phase_; }
  bool answered() const { return phase_ == ResponsePhase::kAnswered; }

  // The response may start (a first delta, or a stream that need not wait for a remote
  // prefill's first token). True when a stream's head must be written now: once.
  bool open();
  FailureDelivery fail();
  // Every choice finished. True when the answer must be written now (it was not yet).
  bool finish();
  // The request was refused by its caller before any delta; nothing is written here.
  void answer_elsewhere() { phase_ = ResponsePhase::kAnswered; }

 private:
  bool stream_;
  ResponsePhase phase_ = ResponsePhase::kAccepted;
};

}  // namespace pdserve
