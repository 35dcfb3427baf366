// The node's start-up capacity line and periodic stats line: exact figures from known stats,
// and the logger thread logs while there is work and stays quiet when idle.
#include "serving/stats_log.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>

namespace pdserve {
namespace {

using namespace std::chrono_literals;

TEST(StatsLogTest, CapacityLineCountsTokensAndConcurrencyAtMaxLength) {
  ServiceStats stats;
  stats.kv_blocks_total = 1000;
  EXPECT_EQ(capacity_log_line(stats, 16, 4096),
            "KV cache: 1000 blocks of 16 tokens = 16000 tokens; maximum concurrency at 4096 "
            "tokens per request: 3.91x");
}

TEST(StatsLogTest, StatsLineIsTheIntervalsRatesAndTheCurrentState) {
  ServiceStats before;
  before.prompt_tokens_total = 100;
  before.generation_tokens_total = 40;
  before.prefix_cache_queried_tokens = 1000;
  before.prefix_cache_hit_tokens = 900;
  ServiceStats now = before;
  now.prompt_tokens_total = 2100;  // 2000 in 4 s
  now.generation_tokens_total = 240;
  now.prefix_cache_queried_tokens = 1400;  // 400 looked up, 100 found
  now.prefix_cache_hit_tokens = 1000;
  now.num_running = 3;
  now.num_waiting = 1;
  now.kv_blocks_total = 200;
  now.kv_blocks_used = 25;
  EXPECT_EQ(stats_log_line(before, now, 4.0),
            "prompt throughput 500.0 tokens/s, generation throughput 50.0 tokens/s; running 3, "
            "waiting 1; KV usage 12.5%; prefix cache hit rate 25.0%");
  EXPECT_EQ(stats_log_line(now, now, 4.0),
            "prompt throughput 0.0 tokens/s, generation throughput 0.0 tokens/s; running 3, "
            "waiting 1; KV usage 12.5%; prefix cache hit rate -");
}

// The logger's stats calls, for a test to wait on: the logger samples once as it starts, then
// once per tick before it logs (or not), so by call n + 1 it has finished n - 1 ticks.
class StatsCalls {
 public:
  // The number of this call, from 1.
  int64_t record() {
    std::lock_guard lock(mutex_);
    const int64_t number = ++count_;
    changed_.notify_all();
    return number;
  }
  bool wait_for(int64_t count) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, 10s, [&] { return count_ >= count; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int64_t count_ = 0;
};

TEST(StatsLogTest, SpecDecodeFiguresAreTheIntervals) {
  ServiceStats before;
  before.spec_decode_method = "ngram";
  before.spec_decode = {2, 6, 3, {2, 1, 0}};
  ServiceStats now = before;
  now.spec_decode = {12, 36, 21, {10, 7, 4}};  // 10 rows, 30 drafts, 18 accepted
  EXPECT_EQ(spec_decode_log(before, now),
            "; spec decode (ngram): acceptance 60.0% of 30 draft tokens, mean acceptance length "
            "2.80, per position 0.80/0.60/0.40");
  EXPECT_EQ(spec_decode_log(now, now), "; spec decode (ngram): no drafts");
  const std::string line = stats_log_line(before, now, 1.0);
  EXPECT_NE(line.find("prefix cache hit rate -; spec decode (ngram): acceptance 60.0%"),
            std::string::npos)
      << line;
  EXPECT_EQ(stats_log_line(ServiceStats{}, ServiceStats{}, 1.0).find("spec decode"),
            std::string::npos);
}

TEST(StatsLogTest, TheLoggerLogsWhileThereIsWorkAndNotWhenIdle) {
  StatsCalls busy_calls;
  testing::internal::CaptureStderr();
  {
    StatsLogger logger(
        [&] {
          ServiceStats stats;
          stats.generation_tokens_total = 5 * busy_calls.record();
          return stats;
        },
        20ms);
    ASSERT_TRUE(busy_calls.wait_for(4));  // two whole ticks
  }
  const std::string busy = testing::internal::GetCapturedStderr();
  EXPECT_NE(busy.find("generation throughput"), std::string::npos) << busy;

  StatsCalls idle_calls;
  testing::internal::CaptureStderr();
  {
    StatsLogger logger(
        [&] {
          idle_calls.record();
          return ServiceStats{};
        },
        20ms);
    ASSERT_TRUE(idle_calls.wait_for(4));  // two whole ticks in which it would have logged
  }
  const std::string idle = testing::internal::GetCapturedStderr();
  EXPECT_EQ(idle, "");
}

}  // namespace
}  // namespace pdserve
