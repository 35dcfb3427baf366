// A JSONL prompt file for pdserve-bench-serving: one JSON object per line with "prompt" (an
// array of token ids, or a string the server tokenizes) and an optional "output_len".
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "bench/serving/workload.h"
#include "common/core/status.h"

namespace pdserve::bench {

// `source` names the text in errors (the file path); each error names the 1-based line. Blank
// lines are skipped; a line without "output_len" gets `default_output_len`. Arrival times are
// left at 0.
Result<std::vector<BenchRequest>> parse_prompt_lines(std::string_view text,
                                                     const std::string& source,
                                                     int default_output_len);

Result<std::vector<BenchRequest>> read_prompt_file(const std::filesystem::path& path,
                                                   int default_output_len);

}  // namespace pdserve::bench
