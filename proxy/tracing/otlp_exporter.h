// Sends finished requests' spans to an OTLP/HTTP collector (otlp_trace.h) without ever making a
// request wait: enqueue() only takes a lock; one background thread POSTs a batch every
// batch_delay, or as soon as max_batch_spans wait, each POST bounded by post_timeout. A queue
// holding max_queue_spans refuses a request's spans whole (a tree is never cut), and a batch
// the collector refused or never answered is dropped; both count in
// pdserve:otlp_spans_dropped_total. Destruction sends what waits, for at most shutdown_flush.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/core/status.h"
#include "common/http/http_client.h"
#include "common/metrics/metrics.h"
#include "proxy/tracing/otlp_trace.h"

namespace pdserve::proxy {

struct OtlpExporterOptions {
  OtlpEndpoint endpoint;
  std::string service_name = "pdserve-proxy";
  size_t max_queue_spans = 4096;
  size_t max_batch_spans = 512;
  std::chrono::milliseconds batch_delay{1000};
  std::chrono::milliseconds post_timeout{5000};
  std::chrono::milliseconds shutdown_flush{3000};
};

class OtlpExporter {
 public:
  // `metrics` must outlive the exporter. InvalidArgument for a batch or queue size of 0.
  static Result<std::unique_ptr<OtlpExporter>> create(OtlpExporterOptions options,
                                                      metrics::Registry& metrics);
  ~OtlpExporter();
  OtlpExporter(const OtlpExporter&) = delete;
  OtlpExporter& operator=(const OtlpExporter&) = delete;

  // Queues the request's spans (otlp_request_spans) for the next batch. Never blocks on I/O.
  void enqueue(const RequestTimeline& aligned, const OtlpRequestInfo& info);

 private:
  OtlpExporter(OtlpExporterOptions options, metrics::Registry& metrics,
               std::unique_ptr<http::HttpClient> client);
  void run();
  // Takes up to max_batch_spans spans, whole requests, off the queue (lock held).
  std::vector<nlohmann::json> take_batch();
  // POSTs the batch; one the collector did not take is counted as dropped (logged once a streak).
  void post(const std::vector<nlohmann::json>& batch, std::chrono::steady_clock::duration timeout);
  std::string new_span_id();

  const OtlpExporterOptions options_;
  metrics::Counter& dropped_;
  metrics::Counter& exported_;
  std::unique_ptr<http::HttpClient> client_;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::vector<nlohmann::json>> queue_;  // one request's spans each
  size_t queued_spans_ = 0;
  bool stopping_ = false;
  bool failing_ = false;  // the last POST failed: log only the first of a streak
  std::mt19937_64 random_;
  std::thread thread_;  // last: starts once everything above exists
};

}  // namespace pdserve::proxy
