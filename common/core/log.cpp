#include "common/core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

#include <nlohmann/json.hpp>

namespace pdserve {
namespace {

std::atomic<LogLevel>& current_level() {
  static std::atomic<LogLevel> level{[] {
    const char* env = std::getenv("PDSERVE_LOG_LEVEL");
    Result<LogLevel> parsed = parse_log_level(env == nullptr ? "info" : env);
    return parsed.ok() ? *parsed : LogLevel::kInfo;
  }()};
  return level;
}

std::atomic<LogFormat>& current_format() {
  static std::atomic<LogFormat> format{LogFormat::kText};
  return format;
}

std::string_view level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

// 2026-11-25T08:52:01.123Z
std::string iso8601_utc(std::chrono::system_clock::time_point time) {
  const auto since_epoch =
      std::chrono::duration_cast<std::chrono::milliseconds>(time.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(since_epoch / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[64];
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                static_cast<int>(since_epoch % 1000));
  return text;
}

}  // namespace

void set_log_level(LogLevel level) {
  current_level().store(level);
}
LogLevel log_level() {
  return current_level().load(std::memory_order_relaxed);
}
void set_log_format(LogFormat format) {
  current_format().store(format);
}

Result<LogLevel> parse_log_level(std::string_view name) {
  for (const LogLevel level : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn, LogLevel::kError}) {
    if (name == level_name(level)) return level;
  }
  return invalid_argument("unknown log level '" + std::string(name) +
                          "' (debug, info, warn or error)");
}

Result<LogFormat> parse_log_format(std::string_view name) {
  if (name == "text") return LogFormat::kText;
  if (name == "json") return LogFormat::kJson;
  return invalid_argument("unknown log format '" + std::string(name) + "' (text or json)");
}

std::string format_log_line(LogFormat format, LogLevel level,
                            std::chrono::system_clock::time_point time, std::string_view file,
                            int line, std::string_view message) {
  const size_t slash = file.rfind('/');
  const std::string source =
      std::string(slash == std::string_view::npos ? file : file.substr(slash + 1)) + ":" +
      std::to_string(line);
  if (format == LogFormat::kJson) {
    const nlohmann::json entry = {{"time", iso8601_utc(time)},
                                  {"level", level_name(level)},
                                  {"source", source},
                                  {"message", message}};
    return entry.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::string upper(level_name(level));
  for (char& c : upper) c = static_cast<char>(c - 'a' + 'A');
  return iso8601_utc(time) + " " + upper + " " + source + "] " + std::string(message);
}

void log_message(LogLevel level, const char* file, int line, std::string_view message) {
  static std::mutex mutex;
  const std::string text = format_log_line(current_format().load(std::memory_order_relaxed),
                                           level, std::chrono::system_clock::now(), file, line,
                                           message);
  std::lock_guard<std::mutex> lock(mutex);
  std::fprintf(stderr, "%s\n", text.c_str());
}

}  // namespace pdserve
