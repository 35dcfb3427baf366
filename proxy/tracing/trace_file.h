// --trace-file: every finished request's Chrome trace events appended to one file as they
// finish, in the Trace Event Format's JSON Array Format: "[" on the first line, then one event
// per line, each followed by ",". The closing "]" is never written (the format makes it
// optional), and every write ends on a line boundary and is flushed, so a file cut anywhere
// (the proxy killed, the disk full, `head -c`) loads in Perfetto / chrome://tracing after
// dropping at most its last, incomplete line. Thread-safe.
#pragma once

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include "common/core/status.h"
#include "proxy/tracing/chrome_trace.h"

namespace pdserve::proxy {

class TraceFile {
 public:
  // Creates or truncates `path` and writes the opening "["; InvalidArgument naming the path
  // and the system's reason when it cannot.
  static Result<std::unique_ptr<TraceFile>> open(const std::string& path);

  // Appends the request's events (and metadata for new processes and threads).
  Status append(const RecordedTimeline& request);

  const std::string& path() const { return path_; }

 private:
  struct CloseFile {
    void operator()(std::FILE* file) const { std::fclose(file); }
  };
  TraceFile(std::string path, std::unique_ptr<std::FILE, CloseFile> file);

  const std::string path_;
  std::mutex mutex_;
  std::unique_ptr<std::FILE, CloseFile> file_;
  ChromeTraceBuilder builder_;
};

}  // namespace pdserve::proxy
