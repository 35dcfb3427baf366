#include "proxy/tracing/trace_file.h"

#include <cerrno>
#include <cstring>

namespace pdserve::proxy {

TraceFile::TraceFile(std::string path, std::unique_ptr<std::FILE, CloseFile> file)
    : path_(std::move(path)), file_(std::move(file)) {}

Result<std::unique_ptr<TraceFile>> TraceFile::open(const std::string& path) {
  std::unique_ptr<std::FILE, CloseFile> file(std::fopen(path.c_str(), "w"));
  if (!file) {
    return invalid_argument("cannot write the trace file " + path + ": " + std::strerror(errno));
  }
  if (std::fputs("[\n", file.get()) < 0 || std::fflush(file.get()) != 0) {
    return invalid_argument("cannot write the trace file " + path + ": " + std::strerror(errno));
  }
  return std::unique_ptr<TraceFile>(new TraceFile(path, std::move(file)));
}

Status TraceFile::append(const RecordedTimeline& request) {
  std::lock_guard lock(mutex_);
  nlohmann::json events = nlohmann::json::array();
  builder_.add(request, events);
  std::string lines;
  for (const nlohmann::json& event : events) lines += event.dump() + ",\n";
  if (std::fwrite(lines.data(), 1, lines.size(), file_.get()) != lines.size() ||
      std::fflush(file_.get()) != 0) {
    return data_loss("writing the trace file " + path_ + " failed: " + std::strerror(errno));
  }
  return {};
}

}  // namespace pdserve::proxy
