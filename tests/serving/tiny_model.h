// The tiny synthetic Qwen3 the serving tests run on: tests/data/reference/configs/tiny.json,
// seed 7, bf16, tied embeddings, 2 layers (the checkpoint of the float64 golden,
// tests/reference/README.md), written once per test process and removed with it.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "common/model/synthetic_checkpoint.h"
#include "serving/engine_assembly.h"

namespace pdserve::serving_test {

struct TinyModel {
  std::filesystem::path dir;  // private to this process: CTest runs tests in parallel
  LoadedModel loaded;
  std::optional<Tokenizer> tokenizer;

  ~TinyModel() {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
};

// Writes and loads the model under build/test-models/NAME-PID.
inline std::unique_ptr<TinyModel> make_tiny_model(const std::string& name) {
  auto built = std::make_unique<TinyModel>();
  built->dir = std::filesystem::path(PDSERVE_BINARY_DIR) / "test-models" /
               (name + "-" + std::to_string(::getpid()));
  SyntheticCheckpointOptions options;
  options.config_path =
      std::filesystem::path(PDSERVE_TEST_DATA_DIR) / "reference" / "configs" / "tiny.json";
  options.out_dir = built->dir;
  options.seed = 7;
  options.num_layers = 2;
  options.dtype = DType::kBF16;
  options.tie_word_embeddings = true;
  options.tokenizer_dir = std::filesystem::path(PDSERVE_ASSETS_DIR) / "qwen3-tokenizer";
  const Result<SyntheticCheckpoint> written = write_synthetic_checkpoint(options);
  EXPECT_TRUE(written.ok()) << written.status().to_string();
  built->loaded = load_model(built->dir.string(), ModelLoadOptions{}).value();
  built->tokenizer = Tokenizer::from_model_dir(built->dir).value();
  return built;
}

}  // namespace pdserve::serving_test
