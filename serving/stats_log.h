// What a node logs about its engine, as vLLM does: a start-up line with the KV cache's capacity
// in tokens and the concurrency that allows at the maximum length, and every few seconds while
// there is work a line with the throughput since the last one, the queue, the KV usage and the
// prefix cache's hit rate.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "common/engine/inference_service.h"

namespace pdserve {

// "KV cache: 1024 blocks of 16 tokens = 16384 tokens; maximum concurrency at 4096 tokens per
// request: 4.00x"
std::string capacity_log_line(const ServiceStats& stats, int block_size, int max_model_len);

// "prompt throughput 812.3 tokens/s, generation throughput 95.1 tokens/s; running 4, waiting 0;
// KV usage 12.5%; prefix cache hit rate 40.0%" over the `seconds` between `before` and `now`
// (the hit rate over that interval too; "-" when nothing was looked up).
// On a node that speculates it ends with spec_decode_log(before, now).
std::string stats_log_line(const ServiceStats& before, const ServiceStats& now, double seconds);
// vLLM's SpecDecoding figures over the interval: "; spec decode (ngram): acceptance 60.0% of
// 120 draft tokens, mean acceptance length 2.80, per position 0.80/0.60/0.40" (mean acceptance
// length: tokens per verify row, 1 + accepted / drafts; per position: the share of verify rows
// that accepted that draft); "; spec decode (ngram): no drafts" when none were verified.
std::string spec_decode_log(const ServiceStats& before, const ServiceStats& now);

// A thread that logs stats_log_line every `interval` when requests ran, waited or finished in
// it (an idle node stays quiet). Stops, with a deadline of one interval, when destroyed.
class StatsLogger {
 public:
  StatsLogger(std::function<ServiceStats()> stats, std::chrono::milliseconds interval);
  ~StatsLogger();
  StatsLogger(const StatsLogger&) = delete;
  StatsLogger& operator=(const StatsLogger&) = delete;

 private:
  void run();

  std::function<ServiceStats()> stats_;
  std::chrono::milliseconds interval_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace pdserve
