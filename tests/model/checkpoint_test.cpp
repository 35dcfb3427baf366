// Checkpoint folders (single and sharded) and hub-id resolution in a fake HF cache.
#include "common/model/checkpoint.h"

#include <cstdlib>

#include <gtest/gtest.h>

#include "common/model/model_path.h"
#include "tests/model/model_test_util.h"

namespace pdserve {
namespace {

using testing::expect_error_mentions;
using testing::make_tiny;
using testing::read_json;
using testing::TempDir;
using testing::tiny_options;
using testing::write_json;

TEST(Checkpoint, OpensSingleFileWithConfigs) {
  TempDir dir;
  Result<Checkpoint> checkpoint = Checkpoint::open(make_tiny(tiny_options(dir.path())));
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status().to_string();
  EXPECT_EQ(checkpoint->dir(), dir.path());
  EXPECT_EQ(checkpoint->config().num_hidden_layers, 2);
  EXPECT_EQ(checkpoint->generation_config().top_k, 20);
  EXPECT_EQ(checkpoint->shards().size(), 1u);
  EXPECT_TRUE(checkpoint->has_tensor("model.norm.weight"));
  EXPECT_FALSE(checkpoint->has_tensor("model.norm"));
  expect_error_mentions(checkpoint->tensor("nope").status(), {"'nope'", dir.path().string()});
  Checkpoint copy = *checkpoint;  // copies stay valid
  EXPECT_EQ(copy.tensor("model.norm.weight")->data, checkpoint->tensor("model.norm.weight")->data);
}

class ShardedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    SyntheticCheckpointOptions options = tiny_options(dir_.path());
    options.max_shard_bytes = 8'000'000;
    make_tiny(options);
  }
  std::filesystem::path index_path() const { return dir_ / "model.safetensors.index.json"; }
  TempDir dir_;
};

TEST_F(ShardedCheckpoint, SameTensorsAsSingleFile) {
  TempDir single;
  Checkpoint a = Checkpoint::open(make_tiny(tiny_options(single.path()))).value();
  Checkpoint b = Checkpoint::open(dir_.path()).value();
  EXPECT_EQ(b.shards().size(), 2u);
  ASSERT_EQ(a.tensor_names(), b.tensor_names());
  for (const std::string& name : a.tensor_names()) {
    TensorView ta = a.tensor(name).value();
    TensorView tb = b.tensor(name).value();
    EXPECT_EQ(ta.shape, tb.shape);
    ASSERT_EQ(ta.nbytes, tb.nbytes);
    EXPECT_EQ(std::memcmp(ta.data, tb.data, ta.nbytes), 0) << name;
  }
}

TEST_F(ShardedCheckpoint, MissingShardIsNamed) {
  std::filesystem::remove(dir_ / "model-00002-of-00002.safetensors");
  Result<Checkpoint> checkpoint = Checkpoint::open(dir_.path());
  EXPECT_EQ(checkpoint.status().code(), StatusCode::kNotFound);
  expect_error_mentions(checkpoint.status(), {"model-00002-of-00002.safetensors", "index"});
}

TEST_F(ShardedCheckpoint, TensorListedButAbsentFromItsShard) {
  nlohmann::json index = read_json(index_path());
  index["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";
  write_json(index_path(), index);
  expect_error_mentions(Checkpoint::open(dir_.path()).status(),
                        {"'model.norm.weight'", "model-00001-of-00002.safetensors"});
}

TEST_F(ShardedCheckpoint, ShardNamesMustStayInTheFolder) {
  nlohmann::json index = read_json(index_path());
  index["weight_map"]["model.norm.weight"] = "../model-00002-of-00002.safetensors";
  write_json(index_path(), index);
  expect_error_mentions(Checkpoint::open(dir_.path()).status(),
                        {"'model.norm.weight'", "file name"});
  index["weight_map"] = {1, 2};
  write_json(index_path(), index);
  expect_error_mentions(Checkpoint::open(dir_.path()).status(),
                        {"weight_map", index_path().string()});
  testing::write_bytes(index_path(), "{\"weight_map\": {");
  expect_error_mentions(Checkpoint::open(dir_.path()).status(),
                        {"malformed", index_path().string()});
}

TEST(Checkpoint, MissingPiecesAreNamed) {
  TempDir dir;
  expect_error_mentions(Checkpoint::open(dir / "absent").status(), {"absent", "does not exist"});
  EXPECT_EQ(Checkpoint::open(dir.path()).status().code(), StatusCode::kNotFound);  // no config
  expect_error_mentions(Checkpoint::open(dir.path()).status(), {"config.json"});
  make_tiny(tiny_options(dir.path()));
  std::filesystem::remove(dir / "model.safetensors");
  expect_error_mentions(Checkpoint::open(dir.path()).status(),
                        {"model.safetensors", "model.safetensors.index.json"});
}

TEST(Checkpoint, TruncatedWeightsAndBadGenerationConfig) {
  TempDir dir;
  make_tiny(tiny_options(dir.path()));
  testing::write_bytes(dir / "generation_config.json", "{\"top_p\": 7}");
  expect_error_mentions(Checkpoint::open(dir.path()).status(), {"generation_config.json", "top_p"});
  std::filesystem::remove(dir / "generation_config.json");  // absent is fine
  ASSERT_TRUE(Checkpoint::open(dir.path()).ok());
  std::filesystem::resize_file(dir / "model.safetensors",
                               std::filesystem::file_size(dir / "model.safetensors") - 100);
  Result<Checkpoint> truncated = Checkpoint::open(dir.path());
  EXPECT_EQ(truncated.status().code(), StatusCode::kDataLoss);
  expect_error_mentions(truncated.status(), {"model.safetensors", "outside the data region"});
}

// Sets an environment variable for the scope of a test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(ModelPath, ResolvesHubIdsInTheHfCache) {
  TempDir dir;
  ScopedEnv hub_cache("HF_HUB_CACHE", nullptr);
  ScopedEnv hf_home("HF_HOME", dir.path().c_str());
  const std::filesystem::path repo = dir / "hub/models--Qwen--Qwen3-0.6B";
  std::filesystem::create_directories(repo / "snapshots/aaa111");
  std::filesystem::create_directories(repo / "snapshots/bbb222");
  std::filesystem::create_directories(repo / "refs");
  testing::write_bytes(repo / "refs/main", "aaa111\n");
  EXPECT_EQ(hf_hub_cache_dir(), dir / "hub");
  EXPECT_EQ(resolve_model_path("Qwen/Qwen3-0.6B").value(), repo / "snapshots/aaa111");

  // A ref naming a missing snapshot falls back to the newest one.
  testing::write_bytes(repo / "refs/main", "ccc333");
  std::filesystem::last_write_time(
      repo / "snapshots/aaa111",
      std::filesystem::file_time_type::clock::now() - std::chrono::hours(1));
  EXPECT_EQ(resolve_model_path("Qwen/Qwen3-0.6B").value(), repo / "snapshots/bbb222");
  std::filesystem::remove(repo / "refs/main");
  EXPECT_EQ(resolve_model_path("Qwen/Qwen3-0.6B").value(), repo / "snapshots/bbb222");
  // Served under the hub id, as vLLM does, not under the snapshot's hash; a folder under its
  // name.
  EXPECT_EQ(default_served_model_name("Qwen/Qwen3-0.6B", repo / "snapshots/bbb222"),
            "Qwen/Qwen3-0.6B");
  EXPECT_EQ(
      default_served_model_name((repo / "snapshots/bbb222").string(), repo / "snapshots/bbb222"),
      "bbb222");

  // HF_HUB_CACHE wins over HF_HOME.
  ScopedEnv hub_override("HF_HUB_CACHE", (dir / "elsewhere").c_str());
  Result<std::filesystem::path> miss = resolve_model_path("Qwen/Qwen3-0.6B");
  EXPECT_EQ(miss.status().code(), StatusCode::kNotFound);
  expect_error_mentions(miss.status(),
                        {(dir / "elsewhere/models--Qwen--Qwen3-0.6B/snapshots").string()});
}

TEST(ModelPath, DirectoriesAndNonsense) {
  TempDir dir;
  EXPECT_EQ(resolve_model_path(dir.path().string()).value(), dir.path());
  expect_error_mentions(resolve_model_path("no-such-model").status(),
                        {"no-such-model", "org/name"});
  expect_error_mentions(resolve_model_path("../../etc").status(), {"org/name"});
}

}  // namespace
}  // namespace pdserve
