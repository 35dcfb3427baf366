#include "serving/stats_log.h"

#include <cstdio>
#include <utility>

#include "common/core/log.h"

namespace pdserve {
namespace {

std::string format(const char* pattern, auto... values) {
  char text[256];
  std::snprintf(text, sizeof text, pattern, values...);
  return text;
}

}  // namespace

std::string capacity_log_line(const ServiceStats& stats, int block_size, int max_model_len) {
  const long long tokens = static_cast<long long>(stats.kv_blocks_total) * block_size;
  const double concurrency =
      max_model_len > 0 ? static_cast<double>(tokens) / max_model_len : 0.0;
  return format("KV cache: %d blocks of %d tokens = %lld tokens; maximum concurrency at %d "
                "tokens per request: %.2fx",
                stats.kv_blocks_total, block_size, tokens, max_model_len, concurrency);
}

std::string stats_log_line(const ServiceStats& before, const ServiceStats& now, double seconds) {
  const double span = seconds > 0 ? seconds : 1.0;
  const double prompt_rate =
      static_cast<double>(now.prompt_tokens_total - before.prompt_tokens_total) / span;
  const double generation_rate =
      static_cast<double>(now.generation_tokens_total - before.generation_tokens_total) / span;
  const double usage = now.kv_blocks_total > 0 ? 100.0 * now.kv_blocks_used / now.kv_blocks_total
                                               : 0.0;
  const int64_t queried = now.prefix_cache_queried_tokens - before.prefix_cache_queried_tokens;
  const int64_t hits = now.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens;
  const std::string hit_rate =
      queried > 0 ? format("%.1f%%", 100.0 * static_cast<double>(hits) / static_cast<double>(queried))
                  : std::string("-");
  std::string line = format(
      "prompt throughput %.1f tokens/s, generation throughput %.1f tokens/s; running "
      "%d, waiting %d; KV usage %.1f%%; prefix cache hit rate %s",
      prompt_rate, generation_rate, now.num_running, now.num_waiting, usage, hit_rate.c_str());
  if (!now.spec_decode_method.empty()) line += spec_decode_log(before, now);
  return line;
}

std::string spec_decode_log(const ServiceStats& before, const ServiceStats& now) {
  const SpecDecodeCounts& a = before.spec_decode;
  const SpecDecodeCounts& b = now.spec_decode;
  const int64_t drafts = b.num_drafts - a.num_drafts;
  const int64_t draft_tokens = b.num_draft_tokens - a.num_draft_tokens;
  const int64_t accepted = b.num_accepted_tokens - a.num_accepted_tokens;
  std::string part = "; spec decode (" + now.spec_decode_method + "): ";
  if (drafts <= 0 || draft_tokens <= 0) return part + "no drafts";
  part += format("acceptance %.1f%% of %lld draft tokens, mean acceptance length %.2f",
                 100.0 * static_cast<double>(accepted) / static_cast<double>(draft_tokens),
                 static_cast<long long>(draft_tokens),
                 1.0 + static_cast<double>(accepted) / static_cast<double>(drafts));
  part += ", per position";
  for (size_t i = 0; i < b.accepted_per_position.size(); ++i) {
    const int64_t earlier = i < a.accepted_per_position.size() ? a.accepted_per_position[i] : 0;
    part += format(
        i == 0 ? " %.2f" : "/%.2f",
        static_cast<double>(b.accepted_per_position[i] - earlier) / static_cast<double>(drafts));
  }
  return part;
}

StatsLogger::StatsLogger(std::function<ServiceStats()> stats, std::chrono::milliseconds interval)
    : stats_(std::move(stats)), interval_(interval), thread_(&StatsLogger::run, this) {}

StatsLogger::~StatsLogger() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void StatsLogger::run() {
  ServiceStats before = stats_();
  auto since = std::chrono::steady_clock::now();
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, interval_, [&] { return stopping_; })) {
    lock.unlock();
    const ServiceStats now = stats_();
    const auto at = std::chrono::steady_clock::now();
    const bool busy = now.num_running + now.num_waiting > 0 ||
                      now.prompt_tokens_total != before.prompt_tokens_total ||
                      now.generation_tokens_total != before.generation_tokens_total;
    if (busy) {
      PDS_LOG_INFO(stats_log_line(before, now, std::chrono::duration<double>(at - since).count()));
    }
    before = now;
    since = at;
    lock.lock();
  }
}

}  // namespace pdserve
