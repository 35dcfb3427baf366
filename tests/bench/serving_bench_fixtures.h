// What several pdserve-bench-serving test files share: the ShareGPT fixture with its oracle
// token counts, the Qwen3 tokenizer's folder, and a runner of the benchmark binary.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace pdserve::bench {

inline const std::filesystem::path kShareGptFixture = std::filesystem::path(PDSERVE_BENCH_DATA_DIR) / "sharegpt_small.json";
inline const std::filesystem::path kQwen3Tokenizer = std::filesystem::path(PDSERVE_ASSETS_DIR) / "qwen3-tokenizer";

// configs/models/qwen3-tokenizer/tokenizer.json (add_special_tokens=True adds none for Qwen3),
// the oracle of which conversations vLLM keeps and of their output lengths.
struct FixtureConversation {
  const char* prompt_start;
  int prompt_tokens;
  int reply_tokens;
};
constexpr FixtureConversation kFixtureCounts[] = {
    {"What should I plant", 14, 38},           // kept
    {"Hi!", 2, 22},                            // prompt < 4
    {"Can you tell me whether", 12, 2},        // reply < 4
    {"Why did my sourdough", 13, 35},          // kept (its later turns are not used)
    {"Please add up all", 1905, 20},           // prompt > 1024
    {"Here is a list of numbers", 472, 2263},  // prompt + reply > 2048
    {"Wie viele Tage", 21, 46},                // kept
    {"Welcome back!", 12, 21},                 // kept: vLLM's prompt is the first turn, any role
};

// Runs the benchmark binary with `args`; returns its exit code, stderr in `errors`.
inline int run_binary(const std::string& args, std::string& errors) {
  const std::filesystem::path err_file =
      std::filesystem::temp_directory_path() / ("bench_serving_stderr_" + std::to_string(getpid()) + ".txt");
  const std::string command =
      std::string(PDSERVE_BENCH_SERVING_BIN) + " " + args + " >/dev/null 2>" + err_file.string();
  const int status = std::system(command.c_str());
  FILE* file = std::fopen(err_file.c_str(), "r");
  errors.clear();
  if (file != nullptr) {
    char buffer[512];
    while (std::fgets(buffer, sizeof(buffer), file) != nullptr) errors += buffer;
    std::fclose(file);
  }
  std::filesystem::remove(err_file);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace pdserve::bench
