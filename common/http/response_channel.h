// How a handler answers one request: a whole response, or a chunked stream (SSE). Every method
// is thread-safe and non-blocking: they post the work to the connection's strand.
#pragma once

#include <functional>
#include <string>

#include "common/http/http_message.h"

namespace pdserve::http {

class ResponseChannel {
 public:
  virtual ~ResponseChannel() = default;

  // A whole response; ends the exchange. Calls after the exchange ended are ignored.
  virtual void send(HttpResponse response) = 0;

  // Starts a streamed response (e.g. content_type "text/event-stream"): chunked for an
  // HTTP/1.1 client; for an HTTP/1.0 client the bytes as written, and the connection is closed
  // after end_stream to end the body.
  virtual void start_stream(int status, std::string content_type, HeaderList headers) = 0;
  // Queues one chunk of the stream. False when the exchange is over (client gone, server
  // stopping) or when the client reads so slowly that the connection's bounded queue is full:
  // the connection is then closed and the cancel callback runs.
  virtual bool write(std::string data) = 0;
  // Ends the stream with the last chunk.
  virtual void end_stream() = 0;

  // `fn` runs once, on an I/O thread, when the client goes away (read EOF or error, write
  // failure, queue overflow) or the server stops before the exchange has ended; at once (on
  // the caller's thread) when that already happened. It must not block.
  virtual void on_cancel(std::function<void()> fn) = 0;
  virtual bool cancelled() const = 0;

  // Runs `fn` on the connection's strand, after the calls made before it: a producer thread
  // (the engine's) hands its results over instead of formatting them on its own time. When the
  // connection or the server is gone (shutdown), `fn` runs at once on the caller's thread, so
  // a result that ends a request is always handled.
  virtual void post(std::function<void()> fn) = 0;
};

}  // namespace pdserve::http
