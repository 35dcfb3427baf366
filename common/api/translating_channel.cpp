#include "common/api/translating_channel.h"

#include <utility>

#include "common/core/json_depth.h"
#include "common/core/log.h"
#include "common/http/api_error_response.h"

namespace pdserve::api {

TranslatingChannel::TranslatingChannel(std::shared_ptr<http::ResponseChannel> client,
                                       std::unique_ptr<ChatAnswerTranslator> translator)
    : client_(std::move(client)), translator_(std::move(translator)) {}

void TranslatingChannel::send(http::HttpResponse response) {
  std::lock_guard lock(mutex_);
  Result<nlohmann::json> body = parse_json_bounded(response.body, "the chat answer");
  if (!body.ok() || !body->is_object()) {
    PDS_LOG_WARN("a chat answer could not be translated: " +
                 (body.ok() ? std::string("not a JSON object") : body.status().message()));
    client_->send(translator_->error(
        502, nlohmann::json::parse(bad_gateway("the chat answer could not be translated").body())));
    return;
  }
  http::HttpResponse out;
  try {
    out = response.status == 200 ? translator_->whole(*body)
                                 : translator_->error(response.status, *body);
  } catch (const nlohmann::json::exception& error) {
    PDS_LOG_WARN(std::string("a chat answer could not be translated: ") + error.what());
    out = translator_->error(
        502, nlohmann::json::parse(bad_gateway("the chat answer could not be translated").body()));
  }
  // Retry-After and the like keep their meaning in every API.
  for (auto& header : response.headers) out.headers.push_back(std::move(header));
  client_->send(std::move(out));
}

void TranslatingChannel::start_stream(int status, std::string content_type,
                                      http::HeaderList headers) {
  client_->start_stream(status, std::move(content_type), std::move(headers));
}

std::string TranslatingChannel::translate_event(const std::string& data) {
  if (data == "[DONE]") {
    finished_ = true;
    return translator_->done();
  }
  Result<nlohmann::json> event = parse_json_bounded(data, "a chat stream event");
  if (!event.ok() || !event->is_object()) {
    PDS_LOG_WARN("a chat stream event could not be translated: " +
                 (event.ok() ? std::string("not a JSON object") : event.status().message()));
    finished_ = true;
    std::string out = translator_->stream_error(
        nlohmann::json::parse(bad_gateway("the chat stream could not be translated").body()));
    return out + translator_->done();
  }
  try {
    if (event->contains("error")) return translator_->stream_error(*event);
    return translator_->chunk(*event);
  } catch (const nlohmann::json::exception& error) {
    // A field of an unexpected type (the chat path never writes one): the stream fails cleanly.
    PDS_LOG_WARN(std::string("a chat stream event could not be translated: ") + error.what());
    finished_ = true;
    std::string out = translator_->stream_error(
        nlohmann::json::parse(bad_gateway("the chat stream could not be translated").body()));
    return out + translator_->done();
  }
}

bool TranslatingChannel::write(std::string data) {
  std::lock_guard lock(mutex_);
  if (finished_) return !client_->cancelled();
  std::string out;
  for (const std::string& event : reader_.feed(data)) {
    if (finished_) break;
    out += translate_event(event);
  }
  if (reader_.overflowed() && !finished_) {
    finished_ = true;
    out += translator_->stream_error(
        nlohmann::json::parse(bad_gateway("a chat stream event was too large").body()));
    out += translator_->done();
  }
  if (out.empty()) return !client_->cancelled();
  return client_->write(std::move(out));
}

void TranslatingChannel::end_stream() {
  std::lock_guard lock(mutex_);
  if (!finished_) {
    // A chat stream always ends with [DONE]; without it the client still gets an end it can read.
    finished_ = true;
    std::string out = translator_->stream_error(
        nlohmann::json::parse(bad_gateway("the chat stream ended without its last event").body()));
    out += translator_->done();
    client_->write(std::move(out));
  }
  client_->end_stream();
}

}  // namespace pdserve::api
