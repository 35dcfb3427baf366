// Shared command-line conventions for every pdserve binary (parsed with CLI11):
// --help prints usage and exits 0; a usage or input error prints one "error: ..." line and
// exits 2; a failure at run time exits 1.
#pragma once

#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "common/core/log.h"
#include "common/core/status.h"

namespace pdserve {

inline constexpr int kExitUsage = 2;
inline constexpr int kExitFailure = 1;

// Parses argv; returns -1 when the program should go on, otherwise the exit code to return.
inline int parse_cli(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return 0;
  } catch (const CLI::CallForVersion&) {
    std::fputs("pdserve 0.1.0\n", stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s\nRun with --help for usage.\n", e.what());
    return kExitUsage;
  }
  return -1;
}

// --log-level and --log-format (common/core/log.h), applied as they are parsed; a value outside
// their lists is a usage error (exit 2).
inline void add_log_options(CLI::App& app) {
  app.add_option_function<std::string>(
         "--log-level",
         [](const std::string& name) { set_log_level(parse_log_level(name).value()); },
         "debug, info, warn or error (default: $PDSERVE_LOG_LEVEL, else info)")
      ->check(CLI::IsMember({"debug", "info", "warn", "error"}));
  app.add_option_function<std::string>(
         "--log-format",
         [](const std::string& name) { set_log_format(parse_log_format(name).value()); },
         "text (ISO-8601 time, level, source, message) or json (one object per line)")
      ->check(CLI::IsMember({"text", "json"}));
}

// Prints a failed Status as one line and returns its exit code: 2 for errors in the user's input
// (bad arguments, missing or malformed files, unavailable device), 1 for everything else.
inline int report_cli_error(const Status& status) {
  std::fprintf(stderr, "error: %s\n", status.message().c_str());
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kOutOfRange:
    case StatusCode::kDataLoss:
    case StatusCode::kUnavailable:
    case StatusCode::kUnimplemented:
    case StatusCode::kResourceExhausted:
      return kExitUsage;
    default:
      return kExitFailure;
  }
}

}  // namespace pdserve
