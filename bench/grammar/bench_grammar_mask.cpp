// pdserve-bench-grammar: what structured outputs cost the engine thread, with Qwen3's
// vocabulary (151,936 logits rows) and a JSON schema:
//  * compiling: the vocabulary's tables plus the first schema (cold), the same schema again
//    (xgrammar's cache), another schema;
//  * the per-token mask: filling the allowed-token bitmask, setting the forbidden logits to
//    -inf and accepting the chosen token, for every sequence of a batch of 1 and of 32, row by
//    row and as the engine does it (ConstraintBatchMasker: the rows on xgrammar's thread pool).
// The figure to hold it against is the model's decode step time (docs/PERF.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/core/cli.h"
#include "common/grammar/constraint.h"
#include "common/tokenizer/tokenizer.h"

namespace pdserve {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

constexpr int kVocab = 151936;
constexpr int32_t kEos = 151645;

const char* kSchema = R"({"type": "object", "properties": {
  "id": {"type": "integer", "minimum": 0, "maximum": 1000000},
  "name": {"type": "string", "maxLength": 32},
  "email": {"type": "string", "pattern": "^[a-z]{1,12}@[a-z]{1,12}\\.com$"},
  "roles": {"type": "array", "items": {"enum": ["admin", "user", "guest"]}, "maxItems": 4},
  "address": {"type": "object", "properties": {
    "street": {"type": "string", "maxLength": 40}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
    "required": ["street", "zip"], "additionalProperties": false},
  "active": {"type": "boolean"}},
  "required": ["id", "name", "email", "roles", "address", "active"],
  "additionalProperties": false})";

const char* kOtherSchema = R"({"type": "object", "properties": {
  "title": {"type": "string", "maxLength": 64}, "score": {"type": "number"},
  "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 8}},
  "required": ["title", "score", "tags"], "additionalProperties": false})";

struct MaskCost {
  double fill_and_mask_us = 0;  // per sequence and token
  double accept_us = 0;
  double step_ms = 0;  // the whole batch, per step
};

enum class Masking { kRowByRow, kBatched };

MaskCost measure(const ConstraintHandle& constraint, int batch, int steps, uint64_t seed,
                 Masking masking) {
  ConstraintBatchMasker masker;
  std::vector<std::optional<ConstraintMatcher>> matchers(static_cast<size_t>(batch));
  for (auto& matcher : matchers) matcher.emplace(constraint);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<std::vector<float>> logits(static_cast<size_t>(batch), std::vector<float>(kVocab));
  double mask_ms = 0;
  double accept_ms = 0;
  for (int step = 0; step < steps; ++step) {
    for (auto& row : logits) {
      for (float& logit : row) logit = uniform(rng);
    }
    const Clock::time_point mask_start = Clock::now();
    if (masking == Masking::kBatched) {
      std::vector<ConstraintMatcher*> batch_matchers;
      std::vector<std::span<float>> rows;
      for (size_t b = 0; b < matchers.size(); ++b) {
        batch_matchers.push_back(&*matchers[b]);
        rows.emplace_back(logits[b]);
      }
      for (const Status& masked : masker.mask(batch_matchers, rows)) {
        PDS_CHECK(masked.ok(), masked.to_string());
      }
    } else {
      for (size_t b = 0; b < matchers.size(); ++b) {
        const Status masked = matchers[b]->mask(logits[b]);
        PDS_CHECK(masked.ok(), masked.to_string());
      }
    }
    mask_ms += ms_since(mask_start);
    std::vector<int32_t> chosen(matchers.size());
    for (size_t b = 0; b < matchers.size(); ++b) {
      chosen[b] = static_cast<int32_t>(std::max_element(logits[b].begin(), logits[b].end()) -
                                       logits[b].begin());
    }
    const Clock::time_point accept_start = Clock::now();
    for (size_t b = 0; b < matchers.size(); ++b) {
      const Status accepted = matchers[b]->accept(chosen[b]);
      PDS_CHECK(accepted.ok(), accepted.to_string());
    }
    accept_ms += ms_since(accept_start);
    // A finished sequence is replaced by a new one, as a serving batch would be.
    for (size_t b = 0; b < matchers.size(); ++b) {
      if (chosen[b] == kEos) matchers[b].emplace(constraint);
    }
  }
  const double tokens = static_cast<double>(steps) * batch;
  return {mask_ms * 1000.0 / tokens, accept_ms * 1000.0 / tokens, (mask_ms + accept_ms) / steps};
}

int run(int argc, char** argv) {
  CLI::App app{"pdserve-bench-grammar: the cost of structured outputs per token"};
  std::filesystem::path tokenizer_path = std::filesystem::path(PDSERVE_ASSETS_DIR) /
                                         "qwen3-tokenizer" / "tokenizer.json";
  int steps = 200;
  app.add_option("--tokenizer", tokenizer_path, "tokenizer.json (Qwen3's by default)");
  app.add_option("--steps", steps, "decode steps per batch size")->check(CLI::PositiveNumber);
  if (const int code = parse_cli(app, argc, argv); code >= 0) return code;

  Result<Tokenizer> tokenizer = Tokenizer::load(tokenizer_path);
  if (!tokenizer.ok()) return report_cli_error(tokenizer.status());
  ConstraintCompiler compiler(*tokenizer, kVocab, {kEos});
  const StructuredOutput schema{StructuredOutput::Kind::kJsonSchema, kSchema};

  Clock::time_point start = Clock::now();
  Result<ConstraintHandle> compiled = compiler.compile(schema);
  if (!compiled.ok()) return report_cli_error(compiled.status());
  const double cold_ms = ms_since(start);
  start = Clock::now();
  PDS_CHECK(compiler.compile(schema).ok(), "recompiling");
  const double cached_ms = ms_since(start);
  start = Clock::now();
  PDS_CHECK(compiler.compile({StructuredOutput::Kind::kJsonSchema, kOtherSchema}).ok(),
            "another schema");
  const double other_ms = ms_since(start);
  std::printf("compile: vocabulary tables + first schema %.1f ms, same schema again %.3f ms, "
              "another schema %.1f ms\n",
              cold_ms, cached_ms, other_ms);

  std::printf("hardware threads: %u (the batched mask uses them all)\n",
              std::thread::hardware_concurrency());
  for (const int batch : {1, 32}) {
    for (const Masking masking : {Masking::kRowByRow, Masking::kBatched}) {
      const MaskCost cost = measure(*compiled, batch, steps, 7, masking);
      std::printf("batch %2d, %-10s: mask (fill bitmask + -inf) %.1f us/token, accept %.1f "
                  "us/token, %.3f ms per step for the batch (%d steps)\n",
                  batch, masking == Masking::kBatched ? "batched" : "row by row",
                  cost.fill_and_mask_us, cost.accept_us, cost.step_ms, steps);
    }
  }
  return 0;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  return pdserve::run(argc, argv);
}
