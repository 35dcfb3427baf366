// A ResponseChannel that a chat completion is written to and that answers the client in
// another API (Responses, Anthropic Messages): whole answers and errors go through
// ChatAnswerTranslator::whole / error, a stream's SSE events through chunk / stream_error /
// done. The serving node and the proxy hand it to their chat completion path unchanged, so
// the new APIs get the chat path's routing, prefill placement and stream resumption.
#pragma once

#include <memory>
#include <mutex>

#include "common/api/chat_answer_translator.h"
#include "common/api/sse_framing.h"
#include "common/http/response_channel.h"

namespace pdserve::api {

class TranslatingChannel final : public http::ResponseChannel {
 public:
  TranslatingChannel(std::shared_ptr<http::ResponseChannel> client,
                     std::unique_ptr<ChatAnswerTranslator> translator);

  void send(http::HttpResponse response) override;
  void start_stream(int status, std::string content_type, http::HeaderList headers) override;
  bool write(std::string data) override;
  void end_stream() override;
  void on_cancel(std::function<void()> fn) override { client_->on_cancel(std::move(fn)); }
  bool cancelled() const override { return client_->cancelled(); }
  void post(std::function<void()> fn) override { client_->post(std::move(fn)); }

 private:
  // Called with mutex_ held: the translation of one chat SSE event's data.
  std::string translate_event(const std::string& data);

  const std::shared_ptr<http::ResponseChannel> client_;
  std::mutex mutex_;  // the chat path writes from one strand; the lock keeps the state whole
  std::unique_ptr<ChatAnswerTranslator> translator_;
  SseDataReader reader_;
  bool finished_ = false;  // [DONE] or an unreadable stream: nothing more is translated
};

}  // namespace pdserve::api
