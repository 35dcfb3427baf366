// The node's start-up capacity line and periodic stats line: exact figures from known stats,
// and the logger thread logs while there is work and stays quiet when idle.
#include "serving/stats_log.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

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

TEST(StatsLogTest, TheLoggerLogsWhileThereIsWorkAndNotWhenIdle) {
  std::atomic<int64_t> generated{0};
  testing::internal::CaptureStderr();
  {
    StatsLogger logger(
        [&] {
          ServiceStats stats;
          stats.generation_tokens_total = generated.fetch_add(5);
          return stats;
        },
        20ms);
    std::this_thread::sleep_for(150ms);
  }
  const std::string busy = testing::internal::GetCapturedStderr();
  EXPECT_NE(busy.find("generation throughput"), std::string::npos) << busy;

  testing::internal::CaptureStderr();
  {
    StatsLogger logger([] { return ServiceStats{}; }, 20ms);
    std::this_thread::sleep_for(150ms);
  }
  const std::string idle = testing::internal::GetCapturedStderr();
  EXPECT_EQ(idle, "");
}

}  // namespace
}  // namespace pdserve
