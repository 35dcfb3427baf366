#include "common/core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace pdserve {
namespace {

LogLevel level_from_env() {
  const char* env = std::getenv("PDSERVE_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  if (std::strcmp(env, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(env, "warn") == 0) return LogLevel::kWarn;
  if (std::strcmp(env, "error") == 0) return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<LogLevel>& current_level() {
  static std::atomic<LogLevel> level{level_from_env()};
  return level;
}

const char* level_tag(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "D";
    case LogLevel::kInfo:
      return "I";
    case LogLevel::kWarn:
      return "W";
    case LogLevel::kError:
      return "E";
  }
  return "?";
}

}  // namespace

void set_log_level(LogLevel level) {
  current_level().store(level);
}
LogLevel log_level() {
  return current_level().load(std::memory_order_relaxed);
}

void log_message(LogLevel level, const char* file, int line, std::string_view message) {
  static std::mutex mutex;
  const char* base = std::strrchr(file, '/');
  base = base != nullptr ? base + 1 : file;
  auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
                 .count();
  std::lock_guard<std::mutex> lock(mutex);
  std::fprintf(stderr, "%s %lld.%03lld %s:%d] %.*s\n", level_tag(level),
               static_cast<long long>(now / 1000), static_cast<long long>(now % 1000), base, line,
               static_cast<int>(message.size()), message.data());
}

}  // namespace pdserve
