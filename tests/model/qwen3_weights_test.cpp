// load_qwen3_weights: layout, zero-copy, huge-page copies, exact conversions, tied heads and refusals.
#include "common/model/qwen3_weights.h"

#include <cstdint>
#include <cstring>

#include <gtest/gtest.h>

#include "common/model/qwen3_layout.h"
#include "tests/model/model_test_util.h"

namespace pdserve {
namespace {

using testing::expect_error_mentions;
using testing::make_tiny;
using testing::read_json;
using testing::TempDir;
using testing::tiny_options;
using testing::write_json;

// Every HostTensor in the order qwen3_tensor_specs lists them, with their HF names.
std::vector<std::pair<std::string, const HostTensor*>> named_tensors(const Qwen3Weights& w) {
  std::vector<std::pair<std::string, const HostTensor*>> out;
  out.emplace_back("model.embed_tokens.weight", &w.embed_tokens);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const Qwen3LayerWeights& l = w.layers[i];
    out.emplace_back(p + "input_layernorm.weight", &l.input_layernorm);
    out.emplace_back(p + "self_attn.q_proj.weight", &l.q_proj);
    out.emplace_back(p + "self_attn.k_proj.weight", &l.k_proj);
    out.emplace_back(p + "self_attn.v_proj.weight", &l.v_proj);
    out.emplace_back(p + "self_attn.o_proj.weight", &l.o_proj);
    out.emplace_back(p + "self_attn.q_norm.weight", &l.q_norm);
    out.emplace_back(p + "self_attn.k_norm.weight", &l.k_norm);
    out.emplace_back(p + "post_attention_layernorm.weight", &l.post_attention_layernorm);
    out.emplace_back(p + "mlp.gate_proj.weight", &l.gate_proj);
    out.emplace_back(p + "mlp.up_proj.weight", &l.up_proj);
    out.emplace_back(p + "mlp.down_proj.weight", &l.down_proj);
  }
  out.emplace_back("model.norm.weight", &w.final_norm);
  return out;
}

bool inside_a_shard(const Checkpoint& checkpoint, const std::byte* data, size_t nbytes) {
  for (const SafetensorsFile& shard : checkpoint.shards()) {
    std::span<const std::byte> bytes = shard.bytes();
    if (data >= bytes.data() && data + nbytes <= bytes.data() + bytes.size()) return true;
  }
  return false;
}

TEST(Qwen3Weights, ZeroCopyWhenDtypesMatch) {
  TempDir dir;
  Checkpoint checkpoint = Checkpoint::open(make_tiny(tiny_options(dir.path()))).value();
  Result<Qwen3Weights> weights = load_qwen3_weights(checkpoint, DType::kBF16);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  EXPECT_EQ(weights->config.hidden_size, 64);
  ASSERT_EQ(weights->layers.size(), 2u);
  for (const auto& [name, tensor] : named_tensors(*weights)) {
    TensorView view = checkpoint.tensor(name).value();
    EXPECT_EQ(tensor->dtype, DType::kBF16) << name;
    EXPECT_EQ(tensor->shape, view.shape) << name;
    EXPECT_EQ(tensor->data, view.data) << name;  // the very bytes of the mmap
    EXPECT_TRUE(inside_a_shard(checkpoint, tensor->data, tensor->nbytes())) << name;
  }
  const Qwen3LayerWeights& layer = weights->layers[1];
  EXPECT_EQ(layer.q_proj.shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(layer.k_proj.shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(layer.o_proj.shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(layer.q_norm.shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(layer.gate_proj.shape, (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(layer.down_proj.shape, (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(weights->embed_tokens.nbytes(), 151936u * 64 * 2);
  // Tied and absent: lm_head is the embedding.
  EXPECT_EQ(weights->lm_head.data, weights->embed_tokens.data);
  EXPECT_EQ(weights->lm_head.shape, weights->embed_tokens.shape);
}

// For a backend computing on the host: every tensor copied out of the mmap, byte for byte,
// large ones on their own 2 MiB-aligned (huge-page) memory.
TEST(Qwen3Weights, HostHugePagesCopiesEveryTensor) {
  TempDir dir;
  Checkpoint checkpoint = Checkpoint::open(make_tiny(tiny_options(dir.path()))).value();
  Result<Qwen3Weights> weights =
      load_qwen3_weights(checkpoint, DType::kBF16, WeightPlacement::kHostHugePages);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  for (const auto& [name, tensor] : named_tensors(*weights)) {
    TensorView view = checkpoint.tensor(name).value();
    EXPECT_EQ(tensor->dtype, DType::kBF16) << name;
    EXPECT_EQ(tensor->shape, view.shape) << name;
    EXPECT_FALSE(inside_a_shard(checkpoint, tensor->data, tensor->nbytes())) << name;
    EXPECT_EQ(std::memcmp(tensor->data, view.data, tensor->nbytes()), 0) << name;
  }
  ASSERT_GE(weights->embed_tokens.nbytes(), size_t{2} << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(weights->embed_tokens.data) % (size_t{2} << 20), 0u);
  EXPECT_EQ(weights->lm_head.data, weights->embed_tokens.data);  // still tied
}

TEST(Qwen3Weights, Bf16ToF32IsExact) {
  TempDir dir;
  Checkpoint checkpoint = Checkpoint::open(make_tiny(tiny_options(dir.path()))).value();
  Qwen3Weights weights = load_qwen3_weights(checkpoint, DType::kF32).value();
  for (const auto& [name, tensor] : named_tensors(weights)) {
    TensorView view = checkpoint.tensor(name).value();
    ASSERT_EQ(tensor->dtype, DType::kF32);
    ASSERT_FALSE(inside_a_shard(checkpoint, tensor->data, tensor->nbytes())) << name;
    const float* converted = tensor->data_as<float>();
    for (int64_t i = 0; i < view.numel(); ++i) {
      uint16_t bits;
      std::memcpy(&bits, view.data + 2 * i, 2);
      ASSERT_EQ(std::bit_cast<uint32_t>(converted[i]), uint32_t{bits} << 16) << name << " " << i;
    }
  }
  EXPECT_EQ(weights.lm_head.data, weights.embed_tokens.data);
}

TEST(Qwen3Weights, F32ToBf16AndF16RoundToNearestEven) {
  TempDir dir;
  SyntheticCheckpointOptions options = tiny_options(dir.path());
  options.dtype = DType::kF32;
  Checkpoint checkpoint = Checkpoint::open(make_tiny(options)).value();
  for (DType target : {DType::kBF16, DType::kF16}) {
    Qwen3Weights weights = load_qwen3_weights(checkpoint, target).value();
    for (const auto& [name, tensor] : named_tensors(weights)) {
      TensorView view = checkpoint.tensor(name).value();
      const float* source = reinterpret_cast<const float*>(view.data);
      const uint16_t* converted = tensor->data_as<uint16_t>();
      for (int64_t i = 0; i < view.numel(); i += 7) {
        uint16_t expected =
            target == DType::kBF16 ? float_to_bf16(source[i]) : float_to_f16(source[i]);
        ASSERT_EQ(converted[i], expected) << name << " " << i;
      }
    }
  }
}

// Rewrites config.json of a checkpoint folder with `edit` applied.
template <typename Edit>
void edit_config(const std::filesystem::path& dir, Edit edit) {
  nlohmann::json config = read_json(dir / "config.json");
  edit(config);
  write_json(dir / "config.json", config);
}

TEST(Qwen3Weights, TiedModelMayAlsoStoreLmHead) {
  TempDir dir;
  SyntheticCheckpointOptions options = tiny_options(dir.path());
  options.tie_word_embeddings = false;
  make_tiny(options);
  edit_config(dir.path(), [](nlohmann::json& c) { c["tie_word_embeddings"] = true; });
  Checkpoint checkpoint = Checkpoint::open(dir.path()).value();
  ASSERT_TRUE(checkpoint.has_tensor("lm_head.weight"));
  Result<Qwen3Weights> weights = load_qwen3_weights(checkpoint, DType::kBF16);
  ASSERT_TRUE(weights.ok()) << weights.status().to_string();
  EXPECT_EQ(weights->lm_head.data, weights->embed_tokens.data);
}

TEST(Qwen3Weights, UntiedModelUsesItsOwnLmHead) {
  TempDir dir;
  SyntheticCheckpointOptions options = tiny_options(dir.path());
  options.tie_word_embeddings = false;
  Checkpoint checkpoint = Checkpoint::open(make_tiny(options)).value();
  Qwen3Weights weights = load_qwen3_weights(checkpoint, DType::kBF16).value();
  EXPECT_EQ(weights.lm_head.data, checkpoint.tensor("lm_head.weight")->data);
  EXPECT_NE(weights.lm_head.data, weights.embed_tokens.data);
  EXPECT_EQ(weights.lm_head.shape, (std::vector<int64_t>{151936, 64}));
}

TEST(Qwen3Weights, UntiedModelWithoutLmHeadIsRefused) {
  TempDir dir;
  make_tiny(tiny_options(dir.path()));
  edit_config(dir.path(), [](nlohmann::json& c) { c["tie_word_embeddings"] = false; });
  Result<Qwen3Weights> weights =
      load_qwen3_weights(Checkpoint::open(dir.path()).value(), DType::kBF16);
  EXPECT_EQ(weights.status().code(), StatusCode::kNotFound);
  expect_error_mentions(weights.status(), {"lm_head.weight", dir.path().string()});
}

TEST(Qwen3Weights, ShapeMismatchNamesTensorAndShapes) {
  TempDir dir;
  make_tiny(tiny_options(dir.path()));
  edit_config(dir.path(), [](nlohmann::json& c) { c["intermediate_size"] = 96; });
  Result<Qwen3Weights> weights =
      load_qwen3_weights(Checkpoint::open(dir.path()).value(), DType::kBF16);
  expect_error_mentions(weights.status(),
                        {"model.layers.0.mlp.gate_proj.weight", "[128, 64]", "[96, 64]"});
}

TEST(Qwen3Weights, MissingAndUnexpectedTensorsAreNamed) {
  TempDir dir;
  make_tiny(tiny_options(dir.path()));
  edit_config(dir.path(), [](nlohmann::json& c) { c["num_hidden_layers"] = 3; });
  Result<Qwen3Weights> missing =
      load_qwen3_weights(Checkpoint::open(dir.path()).value(), DType::kBF16);
  expect_error_mentions(missing.status(),
                        {"lacks 11 tensor(s)", "model.layers.2.input_layernorm.weight"});
  edit_config(dir.path(), [](nlohmann::json& c) { c["num_hidden_layers"] = 1; });
  Result<Qwen3Weights> unexpected =
      load_qwen3_weights(Checkpoint::open(dir.path()).value(), DType::kBF16);
  expect_error_mentions(unexpected.status(), {"11 tensor(s)", "model.layers.1."});
}

TEST(Qwen3Weights, ShardedAndSingleFileLoadIdentically) {
  TempDir dir;
  SyntheticCheckpointOptions single = tiny_options(dir / "single", 5);
  SyntheticCheckpointOptions sharded = tiny_options(dir / "sharded", 5);
  sharded.max_shard_bytes = 100'000;
  Checkpoint a = Checkpoint::open(make_tiny(single)).value();
  Checkpoint b = Checkpoint::open(make_tiny(sharded)).value();
  EXPECT_EQ(a.shards().size(), 1u);
  EXPECT_EQ(b.shards().size(), 3u);  // embed | most of layer 0 and 1 | the rest
  EXPECT_EQ(a.tensor_names(), b.tensor_names());
  Qwen3Weights wa = load_qwen3_weights(a, DType::kF32).value();
  Qwen3Weights wb = load_qwen3_weights(b, DType::kF32).value();
  auto ta = named_tensors(wa);
  auto tb = named_tensors(wb);
  ASSERT_EQ(ta.size(), tb.size());
  for (size_t i = 0; i < ta.size(); ++i) {
    ASSERT_EQ(ta[i].second->nbytes(), tb[i].second->nbytes());
    EXPECT_EQ(std::memcmp(ta[i].second->data, tb[i].second->data, ta[i].second->nbytes()), 0)
        << ta[i].first;
  }
}

TEST(Qwen3Weights, LayoutCoversEveryTensorOnce) {
  ModelConfig config = load_model_config(testing::kTinyConfig).value();
  std::vector<TensorSpec> specs = qwen3_tensor_specs(config, true);
  EXPECT_EQ(specs.size(), 1 + 2 * kQwen3TensorsPerLayer + 1 + 1);
  EXPECT_EQ(specs.back().name, "lm_head.weight");
  std::set<std::string> names;
  for (const TensorSpec& spec : specs) EXPECT_TRUE(names.insert(spec.name).second) << spec.name;
}

}  // namespace
}  // namespace pdserve
