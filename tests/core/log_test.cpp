// The log line formats: ISO-8601 UTC time with milliseconds, level, source, message; JSON lines
// that parse back to the same fields.
#include "common/core/log.h"

#include <gtest/gtest.h>

#include <chrono>

#include <nlohmann/json.hpp>

namespace pdserve {
namespace {

using namespace std::chrono;

const system_clock::time_point kTime =
    sys_days{year{2026} / 11 / 25} + hours{8} + minutes{52} + seconds{1} + milliseconds{7};

TEST(LogTest, TextLinesStartWithAnIso8601UtcTime) {
  EXPECT_EQ(format_log_line(LogFormat::kText, LogLevel::kWarn, kTime, "/src/proxy/main.cpp", 42,
                            "node gone"),
            "2026-11-25T08:52:01.007Z WARN main.cpp:42] node gone");
  EXPECT_EQ(format_log_line(LogFormat::kText, LogLevel::kInfo, kTime, "a.cpp", 1, ""),
            "2026-11-25T08:52:01.007Z INFO a.cpp:1] ");
}

TEST(LogTest, JsonLinesAreOneObjectWithTheSameFields) {
  const std::string line = format_log_line(LogFormat::kJson, LogLevel::kError, kTime,
                                           "common/x.cpp", 9, "a \"quoted\"\nline\t\x01 \xff");
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  const nlohmann::json entry = nlohmann::json::parse(line);
  EXPECT_EQ(entry.size(), 4u);
  EXPECT_EQ(entry["time"], "2026-11-25T08:52:01.007Z");
  EXPECT_EQ(entry["level"], "error");
  EXPECT_EQ(entry["source"], "x.cpp:9");
  EXPECT_EQ(entry["message"], "a \"quoted\"\nline\t\x01 \xEF\xBF\xBD");  // invalid UTF-8 replaced
}

TEST(LogTest, LevelAndFormatNamesParseAndOthersAreRefused) {
  EXPECT_EQ(parse_log_level("debug").value(), LogLevel::kDebug);
  EXPECT_EQ(parse_log_level("error").value(), LogLevel::kError);
  EXPECT_EQ(parse_log_format("json").value(), LogFormat::kJson);
  EXPECT_EQ(parse_log_level("INFO").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_log_level("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_log_format("xml").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve
