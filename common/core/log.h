// Minimal leveled logging to stderr. The level comes from PDSERVE_LOG_LEVEL
// (debug|info|warn|error, default info) or set_log_level().
#pragma once

#include <string_view>

namespace pdserve {

enum class LogLevel { kDebug, kInfo, kWarn, kError };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_message(LogLevel level, const char* file, int line, std::string_view message);

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
