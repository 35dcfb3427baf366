// pdserve-make-model and the synthetic checkpoint writer: determinism, distribution, layout,
// sharding and the command line.
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>

#include <gtest/gtest.h>

#include "common/model/checkpoint.h"
#include "common/model/counter_rng.h"
#include "common/model/qwen3_weights.h"
#include "tests/model/model_test_util.h"

namespace pdserve {
namespace {

using testing::hash_file;
using testing::make_tiny;
using testing::read_bytes;
using testing::read_json;
using testing::TempDir;
using testing::tiny_options;

TEST(MakeModel, SameSeedGivesIdenticalBytesForAnyThreadCount) {
  TempDir dir;
  SyntheticCheckpointOptions one_thread = tiny_options(dir / "a", 7);
  one_thread.threads = 1;
  SyntheticCheckpointOptions many_threads = tiny_options(dir / "b", 7);
  many_threads.threads = 5;
  make_tiny(one_thread);
  make_tiny(many_threads);
  for (const char* name : {"model.safetensors", "config.json", "generation_config.json"}) {
    EXPECT_EQ(hash_file(dir / "a" / name), hash_file(dir / "b" / name)) << name;
  }
}

TEST(MakeModel, DifferentSeedGivesDifferentWeights) {
  TempDir dir;
  make_tiny(tiny_options(dir / "a", 1));
  make_tiny(tiny_options(dir / "b", 2));
  EXPECT_NE(hash_file(dir / "a/model.safetensors"), hash_file(dir / "b/model.safetensors"));
  EXPECT_EQ(hash_file(dir / "a/config.json"), hash_file(dir / "b/config.json"));
}

// The generator uses only integer hashing and IEEE arithmetic, so these bytes must be the same
// on every machine, compiler and thread count. A change here changes every synthetic model.
// (The tensors are laid out as the safetensors library writes them: tests/model/
// transformers_checkpoint_test.py checks that byte for byte.)
TEST(MakeModel, OutputIsPinnedAcrossMachines) {
  TempDir dir;
  make_tiny(tiny_options(dir.path(), 1));
  EXPECT_EQ(hash_file(dir / "model.safetensors"), 0x2ba8f896b2d8a5dull);
}

TEST(MakeModel, PortableMathMatchesLibm) {
  for (double x = 1e-16; x <= 1.0; x *= 1.37) {
    EXPECT_NEAR(portable_log_unit(x), std::log(x), 1e-12 * std::max(1.0, std::fabs(std::log(x))))
        << x;
  }
  EXPECT_EQ(portable_log_unit(1.0), 0.0);
  for (int i = 0; i < 4096; ++i) {
    double u = i / 4096.0 + 1.0 / 9973.0 * (i % 7) / 7.0;
    double sine, cosine;
    portable_sincos_two_pi(u, sine, cosine);
    EXPECT_NEAR(sine, std::sin(2 * M_PI * u), 1e-12) << u;
    EXPECT_NEAR(cosine, std::cos(2 * M_PI * u), 1e-12) << u;
  }
}

TEST(MakeModel, FillMatchesSampleAtAnyOffset) {
  CounterNormal normal(3, hash_name("x"));
  std::vector<float> values(9);
  normal.fill(5, values.size(), 1.0, 0.5, values.data());  // odd start and odd length
  for (size_t k = 0; k < values.size(); ++k) {
    EXPECT_EQ(values[k], static_cast<float>(1.0 + 0.5 * normal.sample(5 + k)));
  }
}

// Moments and the one-sigma mass of a normal distribution, over ~10M embedding values.
TEST(MakeModel, WeightsFollowTheRequestedDistribution) {
  TempDir dir;
  SyntheticCheckpointOptions options = tiny_options(dir.path());
  options.dtype = DType::kF32;
  Result<Checkpoint> checkpoint = Checkpoint::open(make_tiny(options));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
  auto stats = [&](const std::string& name, double expected_mean) {
    TensorView view = checkpoint->tensor(name).value();
    const float* values = reinterpret_cast<const float*>(view.data);
    double sum = 0, sum_sq = 0;
    int64_t within_sigma = 0;
    for (int64_t i = 0; i < view.numel(); ++i) {
      double d = values[i] - expected_mean;
      sum += d;
      sum_sq += d * d;
      within_sigma += std::fabs(d) <= 0.02;
    }
    double n = static_cast<double>(view.numel());
    return std::tuple{sum / n, std::sqrt(sum_sq / n), within_sigma / n};
  };
  auto [mean, stddev, one_sigma] = stats("model.embed_tokens.weight", 0.0);
  EXPECT_NEAR(mean, 0.0, 1e-4);
  EXPECT_NEAR(stddev, 0.02, 1e-4);
  EXPECT_NEAR(one_sigma, 0.6827, 2e-3);
  auto [norm_mean, norm_stddev, norm_sigma] = stats("model.layers.1.input_layernorm.weight", 1.0);
  EXPECT_NEAR(norm_mean, 0.0, 0.005);  // 64 samples
  EXPECT_NEAR(norm_stddev, 0.02, 0.006);
  (void)norm_sigma;
}

TEST(MakeModel, AppliesOverridesAndCopiesSideFiles) {
  TempDir dir;
  SyntheticCheckpointOptions options = tiny_options(dir.path());
  options.num_layers = 3;
  options.dtype = DType::kF16;
  options.tie_word_embeddings = false;
  make_tiny(options);
  nlohmann::json config = read_json(dir / "config.json");
  EXPECT_EQ(config["num_hidden_layers"], 3);
  EXPECT_EQ(config["torch_dtype"], "float16");
  EXPECT_EQ(config["tie_word_embeddings"], false);
  EXPECT_EQ(config["hidden_size"], 64);  // untouched keys survive
  EXPECT_EQ(read_bytes(dir / "tokenizer.json"),
            read_bytes(testing::kTokenizerDir / "tokenizer.json"));
  EXPECT_EQ(read_bytes(dir / "tokenizer_config.json"),
            read_bytes(testing::kTokenizerDir / "tokenizer_config.json"));
  EXPECT_EQ(read_bytes(dir / "generation_config.json"),
            read_bytes(testing::kTinyConfig.parent_path() / "generation_config.json"));
  Checkpoint checkpoint = Checkpoint::open(dir.path()).value();
  EXPECT_TRUE(checkpoint.has_tensor("lm_head.weight"));
  EXPECT_TRUE(checkpoint.has_tensor("model.layers.2.mlp.down_proj.weight"));
  EXPECT_EQ(checkpoint.tensor("model.norm.weight")->dtype, DType::kF16);
}

TEST(MakeModel, TiedModelHasNoLmHeadAndMinimalGenerationConfig) {
  TempDir dir;
  // A config with no generation_config.json beside it.
  std::filesystem::create_directories(dir / "src");
  std::filesystem::copy_file(testing::kTinyConfig, dir / "src/config.json");
  SyntheticCheckpointOptions options = tiny_options(dir / "out");
  options.config_path = dir / "src/config.json";
  make_tiny(options);
  Checkpoint checkpoint = Checkpoint::open(dir / "out").value();
  EXPECT_FALSE(checkpoint.has_tensor("lm_head.weight"));
  EXPECT_EQ(checkpoint.tensor_names().size(), 2 + 2 * 11u);
  nlohmann::json generation = read_json(dir / "out/generation_config.json");
  EXPECT_EQ(generation["bos_token_id"], 151643);
  EXPECT_EQ(generation["eos_token_id"], nlohmann::json::array({151645}));
}

TEST(MakeModel, ShardsAboveTheLimitWithAnIndex) {
  TempDir dir;
  SyntheticCheckpointOptions options = tiny_options(dir.path());
  options.max_shard_bytes = 8'000'000;  // the 19.4 MB embedding gets a shard of its own
  Result<SyntheticCheckpoint> written = write_synthetic_checkpoint(options);
  ASSERT_TRUE(written.ok()) << written.status().to_string();
  ASSERT_EQ(written->weight_files.size(), 2u);
  EXPECT_EQ(written->weight_files[0].filename(), "model-00001-of-00002.safetensors");
  EXPECT_EQ(written->weight_files[1].filename(), "model-00002-of-00002.safetensors");
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors"));
  nlohmann::json index = read_json(dir / "model.safetensors.index.json");
  EXPECT_EQ(index["metadata"]["total_size"], written->weight_bytes);
  EXPECT_EQ(index["weight_map"]["model.embed_tokens.weight"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["model.norm.weight"], "model-00002-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"].size(), 2 + 2 * 11u);

  // Rewriting the same folder unsharded removes the stale shards and index.
  options.max_shard_bytes = kDefaultMaxShardBytes;
  make_tiny(options);
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(dir / "model-00001-of-00002.safetensors"));
  EXPECT_TRUE(Checkpoint::open(dir.path()).ok());
}

TEST(MakeModel, RefusesUnsupportedConfig) {
  TempDir dir;
  nlohmann::json config = read_json(testing::kTinyConfig);
  config["architectures"] = {"LlamaForCausalLM"};
  testing::write_json(dir / "config.json", config);
  SyntheticCheckpointOptions options = tiny_options(dir / "out");
  options.config_path = dir / "config.json";
  Result<SyntheticCheckpoint> written = write_synthetic_checkpoint(options);
  testing::expect_error_mentions(written.status(), {"LlamaForCausalLM", "config.json"});
  options = tiny_options(dir / "out");
  options.tokenizer_dir = dir.path();
  testing::expect_error_mentions(write_synthetic_checkpoint(options).status(), {"tokenizer.json"});
}

// ---- the binary -------------------------------------------------------------------------

struct RunResult {
  int exit_code;
  std::string stdout_text;
  std::string stderr_text;
};

RunResult run_make_model(const TempDir& dir, const std::string& args) {
  const std::string binary =
      std::string(PDSERVE_BINARY_DIR) + "/tools/make_model/pdserve-make-model";
  std::string command = "'" + binary + "' " + args + " >'" + (dir / "stdout").string() + "' 2>'" +
                        (dir / "stderr").string() + "'";
  int status = std::system(command.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_bytes(dir / "stdout"),
          read_bytes(dir / "stderr")};
}

TEST(MakeModelCli, HelpDocumentsEveryFlag) {
  TempDir dir;
  RunResult result = run_make_model(dir, "--help");
  EXPECT_EQ(result.exit_code, 0);
  for (const char* flag : {"--config", "--out", "--seed", "--layers", "--dtype", "--tie", "--untie",
                           "--max-shard-size", "--tokenizer-dir"}) {
    EXPECT_NE(result.stdout_text.find(flag), std::string::npos) << flag;
  }
}

TEST(MakeModelCli, BadInputExitsTwoWithOneErrorLine) {
  TempDir dir;
  const std::string config = "--config '" + testing::kTinyConfig.string() + "'";
  const std::string out = " --out '" + (dir / "m").string() + "'";
  for (const std::string& args :
       {std::string("--bogus"), config + out,  // missing --seed
        config + out + " --seed 1 --dtype int8", config + out + " --seed 1 --layers 0",
        config + out + " --seed 1 --tie --untie", config + out + " --seed 1 --max-shard-size 5XB",
        "--config /nonexistent/config.json" + out + " --seed 1",
        config + out + " --seed 1 --tokenizer-dir '" + dir.path().string() + "'"}) {
    RunResult result = run_make_model(dir, args);
    EXPECT_EQ(result.exit_code, 2) << args;
    EXPECT_EQ(result.stderr_text.rfind("error: ", 0), 0u) << args << ": " << result.stderr_text;
  }
}

TEST(MakeModelCli, WritesALoadableCheckpoint) {
  TempDir dir;
  RunResult result = run_make_model(
      dir, "--config '" + testing::kTinyConfig.string() + "' --out '" + (dir / "m").string() +
               "' --seed 9 --layers 1 --dtype float32 --untie --max-shard-size 10MB");
  ASSERT_EQ(result.exit_code, 0) << result.stderr_text;
  EXPECT_NE(result.stdout_text.find("1 layers"), std::string::npos) << result.stdout_text;
  Result<Checkpoint> checkpoint = Checkpoint::open(dir / "m");
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
  EXPECT_EQ(checkpoint->shards().size(), 3u);  // embed | layer + norm | lm_head (~39 MB each)
  EXPECT_TRUE(load_qwen3_weights(*checkpoint, DType::kF32).ok());
}

}  // namespace
}  // namespace pdserve
