// pdserve-bench-gpu's constant weights: bf16 and FP8 mean the same numbers, and placing them
// allocates exactly the bytes its rooflines count (qwen3_weight_bytes), on a device stand-in.
#include "bench/gpu/bench_weights.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "common/core/dtype.h"
#include "kernels/model/gpu_memory_plan.h"
#include "kernels/model/qwen3_model.h"
#include "tests/kernels_gpu/device_stand_in.h"

namespace pdserve {
namespace {

// A shipped shape cut to `layers` layers and a 1k vocabulary (what is checked holds per layer
// and per token id).
ModelConfig shape(const std::string& name, int layers) {
  ModelConfig config =
      load_model_config(std::filesystem::path(PDSERVE_ASSETS_DIR) / name / "config.json").value();
  config.num_hidden_layers = layers;
  config.vocab_size = 1024;
  return config;
}

// Element (i, j) of a projection as the model computes with it: code times block scale.
float weight_value(const HostTensor& w, int64_t i, int64_t j) {
  const int64_t k = w.shape[1];
  const float value = load_as_float(w.data, w.dtype, static_cast<size_t>(i * k + j));
  if (w.scale == nullptr) return value;
  const int64_t scale_cols = (k + w.scale_block_k - 1) / w.scale_block_k;
  return value * w.scale[(i / w.scale_block_n) * scale_cols + j / w.scale_block_k];
}

TEST(BenchWeights, Fp8AndBf16MeanTheSameWeights) {
  const ModelConfig config = shape("qwen3-0.6b", 1);
  const Qwen3Weights bf16 = constant_qwen3_weights(config, BenchWeights::kBF16);
  const Qwen3Weights fp8 = constant_qwen3_weights(config, BenchWeights::kFp8);
  EXPECT_FALSE(bf16.config.quantization.has_value());
  ASSERT_TRUE(fp8.config.quantization.has_value());
  EXPECT_TRUE(fp8.config.quantization->block_scaled());
  const auto projections = [](const Qwen3LayerWeights& l) {
    return std::vector<const HostTensor*>{&l.q_proj,    &l.k_proj,  &l.v_proj,   &l.o_proj,
                                          &l.gate_proj, &l.up_proj, &l.down_proj};
  };
  const std::vector<const HostTensor*> want = projections(bf16.layers[0]);
  const std::vector<const HostTensor*> got = projections(fp8.layers[0]);
  for (size_t p = 0; p < want.size(); ++p) {
    ASSERT_EQ(want[p]->dtype, DType::kBF16);
    ASSERT_EQ(got[p]->dtype, DType::kF8E4M3);
    ASSERT_EQ(got[p]->shape, want[p]->shape);
    ASSERT_EQ(got[p]->scale_count(),
              (want[p]->shape[0] + 127) / 128 * ((want[p]->shape[1] + 127) / 128));
    const int64_t rows = want[p]->shape[0];
    const int64_t cols = want[p]->shape[1];
    for (const auto& [i, j] : {std::pair<int64_t, int64_t>{0, 0},
                               {rows - 1, cols - 1},
                               {rows / 2, cols / 3},
                               {rows - 1, 0}}) {
      EXPECT_EQ(weight_value(*got[p], i, j), weight_value(*want[p], i, j))
          << "projection " << p << " at " << i << ", " << j;
    }
  }
  EXPECT_NE(weight_value(*want[0], 0, 0), 0.0f);
}

class BenchWeightsPlacement : public ::testing::TestWithParam<BenchWeights> {};

TEST_P(BenchWeightsPlacement, AllocatesTheBytesTheRooflineCounts) {
  for (const char* name : {"qwen3-0.6b", "qwen3-8b"}) {  // tied, untied embeddings
    const ModelConfig config = shape(name, 2);
    DeviceStandIn device;
    const Result<std::unique_ptr<Qwen3Model>> model =
        Qwen3Model::create(device, constant_qwen3_weights(config, GetParam()));
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    EXPECT_EQ(device.allocated(),
              qwen3_weight_bytes(bench_config(config, GetParam()), DType::kBF16))
        << name << ", " << bench_weights_name(GetParam());
  }
}

INSTANTIATE_TEST_SUITE_P(Weights, BenchWeightsPlacement,
                         ::testing::Values(BenchWeights::kBF16, BenchWeights::kFp8),
                         [](const ::testing::TestParamInfo<BenchWeights>& param) {
                           return std::string(bench_weights_name(param.param));
                         });

}  // namespace
}  // namespace pdserve
