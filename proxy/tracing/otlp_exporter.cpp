#include "proxy/tracing/otlp_exporter.h"

#include <cstdio>

#include "common/core/log.h"

namespace pdserve::proxy {

Result<std::unique_ptr<OtlpExporter>> OtlpExporter::create(OtlpExporterOptions options,
                                                           metrics::Registry& metrics) {
  if (options.max_batch_spans == 0 || options.max_queue_spans == 0) {
    return invalid_argument("OTLP batch and queue sizes must be at least 1");
  }
  // Its own I/O thread: a slow collector never delays the proxy's calls to its nodes.
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<http::HttpClient> client, http::HttpClient::create(1));
  return std::unique_ptr<OtlpExporter>(
      new OtlpExporter(std::move(options), metrics, std::move(client)));
}

OtlpExporter::OtlpExporter(OtlpExporterOptions options, metrics::Registry& metrics,
                           std::unique_ptr<http::HttpClient> client)
    : options_(std::move(options)),
      dropped_(metrics.counter("pdserve:otlp_spans_dropped_total",
                               "Spans not exported: the OTLP queue was full, or the collector "
                               "refused or did not answer their batch.")),
      exported_(metrics.counter("pdserve:otlp_spans_exported_total",
                                "Spans the OTLP collector accepted.")),
      client_(std::move(client)),
      random_(std::random_device{}()),
      thread_([this] { run(); }) {}

OtlpExporter::~OtlpExporter() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::string OtlpExporter::new_span_id() {
  char digits[17];
  uint64_t id = 0;
  while (id == 0) id = random_();  // an all-zero span id is invalid
  std::snprintf(digits, sizeof digits, "%016llx", static_cast<unsigned long long>(id));
  return digits;
}

void OtlpExporter::enqueue(const RequestTimeline& aligned, const OtlpRequestInfo& info) {
  std::lock_guard lock(mutex_);
  std::vector<nlohmann::json> spans =
      otlp_request_spans(aligned, info, [this] { return new_span_id(); });
  if (queued_spans_ + spans.size() > options_.max_queue_spans) {
    dropped_.inc(static_cast<double>(spans.size()));
    return;
  }
  queued_spans_ += spans.size();
  queue_.push_back(std::move(spans));
  if (queued_spans_ >= options_.max_batch_spans) wake_.notify_one();
}

std::vector<nlohmann::json> OtlpExporter::take_batch() {
  std::vector<nlohmann::json> batch;
  while (!queue_.empty() &&
         (batch.empty() || batch.size() + queue_.front().size() <= options_.max_batch_spans)) {
    queued_spans_ -= queue_.front().size();
    for (nlohmann::json& span : queue_.front()) batch.push_back(std::move(span));
    queue_.pop_front();
  }
  return batch;
}

void OtlpExporter::post(const std::vector<nlohmann::json>& batch,
                        std::chrono::steady_clock::duration timeout) {
  http::ClientRequest request;
  request.method = "POST";
  request.target = options_.endpoint.path;
  request.content_type = "application/json";
  request.body = otlp_export_request(options_.service_name, batch).dump();
  request.timeout = timeout;
  Result<http::ClientResponse> response =
      client_->fetch_and_wait(options_.endpoint.base, std::move(request));
  const bool accepted = response.ok() && response->status >= 200 && response->status < 300;
  if (accepted) {
    exported_.inc(static_cast<double>(batch.size()));
  } else {
    dropped_.inc(static_cast<double>(batch.size()));
  }
  if (!accepted && !failing_) {
    PDS_LOG_WARN(
        "OTLP collector " + options_.endpoint.base.to_string() + options_.endpoint.path +
        " did not take " + std::to_string(batch.size()) + " spans (" +
        (response.ok() ? "HTTP " + std::to_string(response->status) : response.status().message()) +
        "); dropping spans until it does");
  }
  failing_ = !accepted;
}

void OtlpExporter::run() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, options_.batch_delay,
                   [this] { return stopping_ || queued_spans_ >= options_.max_batch_spans; });
    if (stopping_) break;
    std::vector<nlohmann::json> batch = take_batch();
    if (batch.empty()) continue;
    lock.unlock();
    post(batch, options_.post_timeout);
    lock.lock();
  }
  // Flush what waits, within the shutdown deadline; the rest is dropped.
  const auto deadline = std::chrono::steady_clock::now() + options_.shutdown_flush;
  while (!queue_.empty()) {
    const auto left = deadline - std::chrono::steady_clock::now();
    std::vector<nlohmann::json> batch = take_batch();
    if (left <= std::chrono::milliseconds(1)) {
      dropped_.inc(static_cast<double>(batch.size()));
      continue;
    }
    lock.unlock();
    post(batch, std::min<std::chrono::steady_clock::duration>(left, options_.post_timeout));
    lock.lock();
  }
}

}  // namespace pdserve::proxy
