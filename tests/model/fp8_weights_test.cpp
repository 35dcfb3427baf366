// FP8 checkpoints: pdserve-make-model's Qwen-layout writer and load_qwen3_weights' FP8 path
// (1-byte codes kept as mapped, float32 scales per 128x128 block, per tensor or per channel)
// and its refusals. The oracle is the bf16 checkpoint of the same seed, quantized here.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>

#include <gtest/gtest.h>

#include "common/core/float8.h"
#include "common/model/qwen3_layout.h"
#include "common/model/qwen3_weights.h"
#include "common/model/safetensors_writer.h"
#include "tests/model/model_test_util.h"

namespace pdserve {
namespace {

using testing::expect_error_mentions;
using testing::make_tiny;
using testing::read_json;
using testing::TempDir;
using testing::tiny_options;
using testing::write_json;

// A small Qwen3 shape whose projections span several 128x128 blocks, one partial.
std::filesystem::path write_block_config(const TempDir& dir) {
  nlohmann::json config = read_json(testing::kTinyConfig);
  config["hidden_size"] = 256;
  config["intermediate_size"] = 320;  // 2.5 blocks: the last block is partial
  config["head_dim"] = 64;
  config["num_attention_heads"] = 4;
  config["num_key_value_heads"] = 2;
  config["vocab_size"] = 512;
  config["bos_token_id"] = 1;
  config["eos_token_id"] = 2;
  const std::filesystem::path path = dir / "source_config.json";
  write_json(path, config);
  return path;
}

SyntheticCheckpointOptions block_options(const TempDir& dir, const std::string& name, bool fp8) {
  SyntheticCheckpointOptions options = tiny_options(dir / name, 7);
  options.config_path = write_block_config(dir);
  options.fp8 = fp8;
  return options;
}

float dequantized(const HostTensor& t, int64_t i, int64_t j) {
  const int64_t k = t.shape[1];
  const int64_t scale_cols = (k + t.scale_block_k - 1) / t.scale_block_k;
  const float code = fp8_e4m3_to_float(t.data_as<uint8_t>()[i * k + j]);
  return code * t.scale[(i / t.scale_block_n) * scale_cols + j / t.scale_block_k];
}

const std::vector<HostTensor Qwen3LayerWeights::*>& linear_slots() {
  static const std::vector<HostTensor Qwen3LayerWeights::*> slots = {
      &Qwen3LayerWeights::q_proj,   &Qwen3LayerWeights::k_proj,    &Qwen3LayerWeights::v_proj,
      &Qwen3LayerWeights::o_proj,   &Qwen3LayerWeights::gate_proj, &Qwen3LayerWeights::up_proj,
      &Qwen3LayerWeights::down_proj};
  return slots;
}

TEST(Fp8Weights, MakeModelWritesQwensLayoutQuantizedFromTheBf16Weights) {
  TempDir dir;
  Checkpoint fp8 = Checkpoint::open(make_tiny(block_options(dir, "fp8", true))).value();
  Checkpoint bf16 = Checkpoint::open(make_tiny(block_options(dir, "bf16", false))).value();
  const nlohmann::json quantization = read_json(dir / "fp8" / "config.json")["quantization_config"];
  EXPECT_EQ(quantization, nlohmann::json::parse(R"({"activation_scheme": "dynamic", "fmt": "e4m3",
      "quant_method": "fp8", "weight_block_size": [128, 128]})"));
  EXPECT_FALSE(read_json(dir / "bf16" / "config.json").contains("quantization_config"));
  ASSERT_TRUE(fp8.config().quantization.has_value());
  for (const TensorSpec& spec : qwen3_tensor_specs(fp8.config(), false)) {
    TensorView view = fp8.tensor(spec.name).value();
    TensorView source = bf16.tensor(spec.name).value();
    if (!spec.is_linear) {
      // Embeddings and norms: the bf16 tensors themselves.
      EXPECT_EQ(view.dtype, DType::kBF16) << spec.name;
      EXPECT_EQ(std::memcmp(view.data, source.data, view.nbytes), 0) << spec.name;
      continue;
    }
    EXPECT_EQ(view.dtype, DType::kF8E4M3) << spec.name;
    TensorView scales = fp8.tensor(spec.name + "_scale_inv").value();
    EXPECT_EQ(scales.dtype, DType::kBF16);
    const int64_t n = spec.shape[0], k = spec.shape[1];
    const int64_t rows = (n + 127) / 128, cols = (k + 127) / 128;
    ASSERT_EQ(scales.shape, (std::vector<int64_t>{rows, cols})) << spec.name;
    std::vector<float> w(static_cast<size_t>(n * k));
    convert_elements(source.data, DType::kBF16, w.data(), DType::kF32, w.size());
    std::vector<float> s(static_cast<size_t>(rows * cols));
    convert_elements(scales.data, DType::kBF16, s.data(), DType::kF32, s.size());
    const auto* codes = reinterpret_cast<const uint8_t*>(view.data);
    for (int64_t bi = 0; bi < rows; ++bi) {
      for (int64_t bj = 0; bj < cols; ++bj) {
        float amax = 0;
        for (int64_t i = bi * 128; i < std::min(n, bi * 128 + 128); ++i) {
          for (int64_t j = bj * 128; j < std::min(k, bj * 128 + 128); ++j) {
            amax = std::max(amax, std::fabs(w[i * k + j]));
          }
        }
        const float scale = s[bi * cols + bj];
        // amax / 448 as bf16 stores it (relative step 2^-8).
        EXPECT_NEAR(scale, amax / 448.0f, amax / 448.0f / 256.0f) << spec.name;
        for (int64_t i = bi * 128; i < std::min(n, bi * 128 + 128); ++i) {
          for (int64_t j = bj * 128; j < std::min(k, bj * 128 + 128); ++j) {
            const float q = w[i * k + j] / scale;
            ASSERT_EQ(codes[i * k + j], float_to_fp8_e4m3_saturated(q)) << spec.name << " " << i;
          }
        }
      }
    }
  }
}

TEST(Fp8Weights, LinearWeightsLoadAsMappedCodesWithBlockScales) {
  TempDir dir;
  Checkpoint fp8 = Checkpoint::open(make_tiny(block_options(dir, "fp8", true))).value();
  Checkpoint bf16 = Checkpoint::open(make_tiny(block_options(dir, "bf16", false))).value();
  Result<Qwen3Weights> loaded = load_qwen3_weights(fp8, DType::kBF16);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  Qwen3Weights reference = load_qwen3_weights(bf16, DType::kF32).value();
  EXPECT_EQ(loaded->embed_tokens.dtype, DType::kBF16);
  EXPECT_EQ(loaded->layers[0].input_layernorm.dtype, DType::kBF16);
  EXPECT_EQ(loaded->embed_tokens.scale, nullptr);
  for (size_t l = 0; l < loaded->layers.size(); ++l) {
    for (auto slot : linear_slots()) {
      const HostTensor& t = loaded->layers[l].*slot;
      const HostTensor& r = reference.layers[l].*slot;
      ASSERT_EQ(t.dtype, DType::kF8E4M3);
      EXPECT_EQ(t.nbytes(), static_cast<size_t>(t.numel()));  // one byte a weight
      EXPECT_EQ(t.scale_block_n, 128);
      EXPECT_EQ(t.scale_block_k, 128);
      ASSERT_NE(t.scale, nullptr);
      const std::byte* begin = fp8.shards()[0].bytes().data();
      EXPECT_TRUE(t.data >= begin && t.data < begin + fp8.shards()[0].bytes().size())
          << "not the mapped file's bytes";
      // Each dequantized weight is within half an E4M3 step of the bf16 weight (2^-4 relative
      // for normals, half the subnormal step 2^-10 x scale below 2^-6 x scale).
      for (int64_t i = 0; i < t.shape[0]; ++i) {
        for (int64_t j = 0; j < t.shape[1]; ++j) {
          const float exact = r.data_as<float>()[i * t.shape[1] + j];
          const float scale = t.scale[(i / 128) * ((t.shape[1] + 127) / 128) + j / 128];
          ASSERT_NEAR(dequantized(t, i, j), exact,
                      std::max(std::fabs(exact) / 16.0f, scale / 1024.0f) * 1.01f);
        }
      }
    }
  }
}

TEST(Fp8Weights, HostHugePagesCopiesTheCodesUnexpanded) {
  TempDir dir;
  Checkpoint fp8 = Checkpoint::open(make_tiny(block_options(dir, "fp8", true))).value();
  Qwen3Weights mapped = load_qwen3_weights(fp8, DType::kF32).value();
  Qwen3Weights copied =
      load_qwen3_weights(fp8, DType::kF32, WeightPlacement::kHostHugePages).value();
  const HostTensor& a = mapped.layers[1].down_proj;
  const HostTensor& b = copied.layers[1].down_proj;
  EXPECT_EQ(b.dtype, DType::kF8E4M3);
  EXPECT_NE(a.data, b.data);
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes()), 0);
  EXPECT_EQ(copied.layers[1].input_layernorm.dtype, DType::kF32);  // the rest: compute dtype
}

// The tensors of a checkpoint folder, editable, written back as one model.safetensors.
struct StoredTensor {
  DType dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
using TensorMap = std::map<std::string, StoredTensor>;

template <typename Edit>
void rewrite_tensors(const std::filesystem::path& dir, Edit edit) {
  TensorMap tensors;
  {
    Checkpoint checkpoint = Checkpoint::open(dir).value();
    for (const std::string& name : checkpoint.tensor_names()) {
      TensorView view = checkpoint.tensor(name).value();
      tensors[name] = {view.dtype, view.shape,
                       std::string(reinterpret_cast<const char*>(view.data), view.nbytes)};
    }
  }
  edit(tensors);
  std::vector<SafetensorsEntry> entries;
  std::string data;
  for (const auto& [name, tensor] : tensors) {
    entries.push_back({name, tensor.dtype, tensor.shape});
    data += tensor.bytes;
  }
  testing::write_bytes(dir / "model.safetensors",
                       encode_safetensors_header(entries, {{"format", "pt"}}) + data);
}

template <typename Edit>
void edit_config(const std::filesystem::path& dir, Edit edit) {
  nlohmann::json config = read_json(dir / "config.json");
  edit(config);
  write_json(dir / "config.json", config);
}

StoredTensor f32_tensor(std::vector<int64_t> shape, const std::vector<float>& values) {
  return {DType::kF32, std::move(shape),
          std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4)};
}

const std::string kQ = "model.layers.0.self_attn.q_proj.weight";

TEST(Fp8Weights, PerTensorAndPerChannelScalesLoad) {
  for (bool per_channel : {false, true}) {
    TempDir dir;
    make_tiny(block_options(dir, "fp8", true));
    edit_config(dir / "fp8",
                [](nlohmann::json& c) { c["quantization_config"].erase("weight_block_size"); });
    // Every projection gets weight_scale (a scalar, or [n, 1]) in place of its block scales.
    rewrite_tensors(dir / "fp8", [&](TensorMap& tensors) {
      std::vector<std::string> owners;
      for (const auto& [name, tensor] : tensors) {
        if (name.ends_with("_scale_inv")) owners.push_back(name.substr(0, name.size() - 10));
      }
      for (const std::string& owner : owners) {
        tensors.erase(owner + "_scale_inv");
        const int64_t n = tensors[owner].shape[0];
        std::vector<float> values(per_channel ? static_cast<size_t>(n) : 1);
        for (size_t i = 0; i < values.size(); ++i) values[i] = 0.001f * static_cast<float>(i + 1);
        tensors[owner + "_scale"] =
            f32_tensor(per_channel ? std::vector<int64_t>{n, 1} : std::vector<int64_t>{}, values);
      }
    });
    Result<Qwen3Weights> w =
        load_qwen3_weights(Checkpoint::open(dir / "fp8").value(), DType::kBF16);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    const HostTensor& q = w->layers[0].q_proj;
    EXPECT_EQ(q.scale_block_n, per_channel ? 1 : 256);
    EXPECT_EQ(q.scale_block_k, 256);
    EXPECT_EQ(q.scale_count(), per_channel ? 256 : 1);
    EXPECT_FLOAT_EQ(dequantized(q, 3, 5), fp8_e4m3_to_float(q.data_as<uint8_t>()[3 * 256 + 5]) *
                                              (per_channel ? 0.004f : 0.001f));
  }
}

TEST(Fp8Weights, MalformedFp8CheckpointsAreRefusedNamingTheTensor) {
  struct Case {
    const char* what;
    std::function<void(TensorMap&)> edit;
    StatusCode code;
    std::vector<std::string> mentions;
  };
  const std::vector<Case> cases = {
      {"missing scale",
       [](TensorMap& t) { t.erase(kQ + "_scale_inv"); },
       StatusCode::kNotFound,
       {kQ, kQ + "_scale_inv"}},
      {"scale of the wrong shape",
       [](TensorMap& t) {
         t[kQ + "_scale_inv"] = f32_tensor({1, 2}, {1.0f, 1.0f});
       },
       StatusCode::kInvalidArgument,
       {kQ + "_scale_inv", "[1, 2]", "[2, 2]"}},
      {"non-finite scale",
       [](TensorMap& t) {
         t[kQ + "_scale_inv"] = f32_tensor({2, 2}, {1.0f, NAN, 1.0f, 1.0f});
       },
       StatusCode::kInvalidArgument,
       {kQ + "_scale_inv", "finite"}},
      {"two scales",
       [](TensorMap& t) {
         t[kQ + "_scale"] = f32_tensor({2, 2}, {1, 1, 1, 1});
       },
       StatusCode::kInvalidArgument,
       {kQ + "_scale_inv", kQ + "_scale'"}},
      {"FP8 embeddings",
       [](TensorMap& t) {
         StoredTensor& e = t["model.embed_tokens.weight"];
         e.dtype = DType::kF8E4M3;
         e.bytes.resize(e.bytes.size() / 2);
       },
       StatusCode::kUnimplemented,
       {"model.embed_tokens.weight", "FP8"}},
      {"scale of a bf16 weight",
       [](TensorMap& t) {
         t["model.norm.weight_scale_inv"] = f32_tensor({1, 1}, {1.0f});
       },
       StatusCode::kInvalidArgument,
       {"model.norm.weight_scale_inv"}},
  };
  for (const Case& c : cases) {
    TempDir dir;
    make_tiny(block_options(dir, "fp8", true));
    rewrite_tensors(dir / "fp8", c.edit);
    Result<Qwen3Weights> w =
        load_qwen3_weights(Checkpoint::open(dir / "fp8").value(), DType::kBF16);
    EXPECT_EQ(w.status().code(), c.code) << c.what << ": " << w.status().to_string();
    for (const std::string& part : c.mentions) {
      EXPECT_NE(w.status().message().find(part), std::string::npos)
          << c.what << ": '" << w.status().message() << "' lacks '" << part << "'";
    }
  }
}

TEST(Fp8Weights, Fp8TensorsNeedAQuantizationConfig) {
  TempDir dir;
  make_tiny(block_options(dir, "fp8", true));
  edit_config(dir / "fp8", [](nlohmann::json& c) { c.erase("quantization_config"); });
  Result<Qwen3Weights> w = load_qwen3_weights(Checkpoint::open(dir / "fp8").value(), DType::kBF16);
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  expect_error_mentions(w.status(),
                        {"model.layers.0.self_attn.q_proj.weight", "quantization_config"});
}

}  // namespace
}  // namespace pdserve
