// pdserve-bench-tokenizer: encode throughput on one thread, in MB/s of UTF-8 input, for English,
// CJK and code text built deterministically from built-in paragraphs (see corpus.cpp), and the
// load time of tokenizer.json. --dump-dir writes the same text for the comparison with Hugging
// Face's tokenizers (tools/oracle/bench_tokenizer_oracle.py).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <time.h>

#include "bench/tokenizer/corpus.h"
#include "common/core/cli.h"
#include "common/core/files.h"
#include "common/tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// CPU time of this (single-threaded) process: on a shared machine it stays close to the
// uncontended figure while wall time grows with the load.
double cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

struct Timing {
  double wall = 1e30;
  double cpu = 1e30;
  void keep_best(Clock::time_point wall_start, double cpu_start) {
    wall = std::min(wall, seconds_since(wall_start));
    cpu = std::min(cpu, cpu_seconds() - cpu_start);
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Measures pdserve tokenizer encode throughput (one thread) and load time."};
  std::string tokenizer_path = std::string(PDSERVE_ASSETS_DIR) + "/qwen3-tokenizer/tokenizer.json";
  double megabytes = 4.0;
  size_t document_bytes = 16 * 1024;
  int repeats = 3;
  uint32_t seed = 1;
  std::string dump_dir;
  app.add_option("--tokenizer", tokenizer_path, "tokenizer.json to load")->check(CLI::ExistingFile);
  app.add_option("--mb", megabytes, "MB (10^6 bytes) of text per corpus")
      ->check(CLI::Range(0.01, 1000.0));
  app.add_option("--document-bytes", document_bytes,
                 "Bytes per encode() call (documents of whole paragraphs)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 30));
  app.add_option("--repeats", repeats, "Timed passes per measurement; the best is reported")
      ->check(CLI::Range(1, 100));
  app.add_option("--seed", seed, "Seed of the paragraph shuffle");
  app.add_option("--dump-dir", dump_dir,
                 "Also write each corpus to <dir>/<name>.txt (documents separated by \\f)");
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;

  Timing load;
  pdserve::Result<pdserve::Tokenizer> tokenizer = pdserve::invalid_argument("not loaded");
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    const double cpu_start = cpu_seconds();
    tokenizer = pdserve::Tokenizer::load(tokenizer_path);
    if (!tokenizer.ok()) return pdserve::report_cli_error(tokenizer.status());
    load.keep_best(start, cpu_start);
  }
  std::printf("load %s: %.1f ms wall, %.1f ms CPU (best of %d)\n", tokenizer_path.c_str(),
              load.wall * 1e3, load.cpu * 1e3, repeats);

  const auto total_bytes = static_cast<size_t>(megabytes * 1e6);
  for (auto kind : {pdserve::bench::CorpusKind::kEnglish, pdserve::bench::CorpusKind::kCjk,
                    pdserve::bench::CorpusKind::kCode}) {
    const std::vector<std::string> documents =
        pdserve::bench::make_corpus(kind, total_bytes, document_bytes, seed);
    size_t bytes = 0;
    for (const std::string& document : documents) bytes += document.size();
    if (!dump_dir.empty()) {
      std::string joined;
      for (const std::string& document : documents) (joined += document) += '\f';
      const auto path = std::filesystem::path(dump_dir) /
                        (std::string(pdserve::bench::corpus_name(kind)) + ".txt");
      if (pdserve::Status status = pdserve::write_file(path, joined); !status.ok())
        return pdserve::report_cli_error(status);
    }
    Timing encode;
    size_t tokens = 0;
    for (int r = 0; r < repeats; ++r) {
      tokens = 0;
      const auto start = Clock::now();
      const double cpu_start = cpu_seconds();
      for (const std::string& document : documents) {
        pdserve::Result<std::vector<int32_t>> ids = tokenizer->encode(document);
        if (!ids.ok()) return pdserve::report_cli_error(ids.status());
        tokens += ids->size();
      }
      encode.keep_best(start, cpu_start);
    }
    const double megabytes_in = static_cast<double>(bytes) / 1e6;
    std::printf(
        "encode %-7s: %6.2f MB/s wall, %6.2f MB/s CPU, %8.0f tokens/s CPU  (%zu bytes in %zu "
        "documents of ~%zu bytes, %zu tokens, best of %d)\n",
        pdserve::bench::corpus_name(kind), megabytes_in / encode.wall, megabytes_in / encode.cpu,
        static_cast<double>(tokens) / encode.cpu, bytes, documents.size(), document_bytes, tokens,
        repeats);
  }
  return 0;
}
