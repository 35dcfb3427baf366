#include "common/model/model_path.h"

#include <cstdlib>
#include <string>

#include "common/core/files.h"

namespace pdserve {
namespace {

namespace fs = std::filesystem;

const char* non_empty_env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

bool looks_like_hub_id(std::string_view spec) {
  size_t slash = spec.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == spec.size()) return false;
  if (spec.find('/', slash + 1) != std::string_view::npos) return false;
  return spec.find("..") == std::string_view::npos && spec.front() != '.' && spec.front() != '~';
}

std::string trim(std::string text) {
  const char* blanks = " \t\r\n";
  size_t begin = text.find_first_not_of(blanks);
  if (begin == std::string::npos) return {};
  return text.substr(begin, text.find_last_not_of(blanks) - begin + 1);
}

// The newest snapshot folder, or empty when there is none.
fs::path newest_snapshot(const fs::path& snapshots) {
  std::error_code ec;
  fs::path newest;
  fs::file_time_type newest_time;
  for (const fs::directory_entry& entry : fs::directory_iterator(snapshots, ec)) {
    if (!entry.is_directory(ec)) continue;
    fs::file_time_type time = entry.last_write_time(ec);
    if (newest.empty() || time > newest_time) {
      newest = entry.path();
      newest_time = time;
    }
  }
  return newest;
}

}  // namespace

fs::path hf_hub_cache_dir() {
  if (const char* hub_cache = non_empty_env("HF_HUB_CACHE")) return hub_cache;
  if (const char* hf_home = non_empty_env("HF_HOME")) return fs::path(hf_home) / "hub";
  const char* home = non_empty_env("HOME");
  return fs::path(home != nullptr ? home : "/") / ".cache" / "huggingface" / "hub";
}

Result<fs::path> resolve_model_path(std::string_view spec) {
  std::error_code ec;
  fs::path as_path{std::string(spec)};
  if (fs::is_directory(as_path, ec)) return as_path;
  if (!looks_like_hub_id(spec)) {
    return not_found("model '" + std::string(spec) +
                     "' is not a directory nor a hub id of the form org/name");
  }
  std::string repo_folder = "models--" + std::string(spec);
  repo_folder.replace(repo_folder.find('/'), 1, "--");
  fs::path repo = hf_hub_cache_dir() / repo_folder;
  fs::path snapshots = repo / "snapshots";

  Result<std::string> ref = read_text_file(repo / "refs" / "main");
  if (ref.ok()) {
    std::string commit = trim(*ref);
    fs::path snapshot = snapshots / commit;
    if (!commit.empty() && commit.front() != '.' && commit.find('/') == std::string::npos &&
        fs::is_directory(snapshot, ec)) {
      return snapshot;
    }
  }
  fs::path snapshot = newest_snapshot(snapshots);
  if (!snapshot.empty()) return snapshot;
  return not_found("model '" + std::string(spec) +
                   "' is not a directory and is not in the Hugging Face cache (looked in '" +
                   snapshots.string() + "'; set HF_HUB_CACHE or HF_HOME to another cache)");
}

std::string default_served_model_name(std::string_view spec, const fs::path& resolved) {
  std::error_code ec;
  if (!fs::is_directory(fs::path(std::string(spec)), ec)) return std::string(spec);
  return resolved.filename().string();
}

}  // namespace pdserve
