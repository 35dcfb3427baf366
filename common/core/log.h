// Leveled logging to stderr, one line per message: an ISO-8601 UTC timestamp with milliseconds,
// the level, the source and the message as text, or the same fields as one JSON object per line
// (--log-format json) for log shippers. The level comes from PDSERVE_LOG_LEVEL
// (debug|info|warn|error, default info), --log-level (common/core/cli.h) or set_log_level().
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "common/core/status.h"

namespace pdserve {

enum class LogLevel { kDebug, kInfo, kWarn, kError };
enum class LogFormat { kText, kJson };

void set_log_level(LogLevel level);
LogLevel log_level();
void set_log_format(LogFormat format);
void log_message(LogLevel level, const char* file, int line, std::string_view message);

// "debug", "info", "warn", "error"; "text", "json". InvalidArgument for anything else.
Result<LogLevel> parse_log_level(std::string_view name);
Result<LogFormat> parse_log_format(std::string_view name);

// One line as log_message writes it, without the newline. `file` may be a path: its base name
// is shown. Invalid UTF-8 in a JSON line's message is replaced (U+FFFD).
std::string format_log_line(LogFormat format, LogLevel level,
                            std::chrono::system_clock::time_point time, std::string_view file,
                            int line, std::string_view message);

}  // namespace pdserve

#define PDS_LOG(level, msg)                                                          \
  do {                                                                               \
    if (::pdserve::LogLevel::level >= ::pdserve::log_level())                        \
      ::pdserve::log_message(::pdserve::LogLevel::level, __FILE__, __LINE__, (msg)); \
  } while (0)
#define PDS_LOG_DEBUG(msg) PDS_LOG(kDebug, msg)
#define PDS_LOG_INFO(msg) PDS_LOG(kInfo, msg)
#define PDS_LOG_WARN(msg) PDS_LOG(kWarn, msg)
#define PDS_LOG_ERROR(msg) PDS_LOG(kError, msg)
