// FP8 projections placed on a backend with memory of its own (as on CUDA), run everywhere with
// a stand-in whose "device" memory is host memory: every projection stays one byte a weight
// (the codes copied verbatim, q/k/v and gate/up concatenated), the scale grids travel beside
// them, and nothing else is placed for them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/model/checkpoint.h"
#include "common/model/qwen3_weights.h"
#include "common/model/synthetic_checkpoint.h"
#include "kernels/model/qwen3_model.h"
#include "tests/kernels_gpu/device_stand_in.h"

namespace pdserve {
namespace {

// Codes and 128x128 block scales of a pattern unique to (seed, element).
HostTensor fake_fp8(const HostTensor& like, int seed) {
  const int64_t n = like.shape[0];
  const int64_t k = like.shape[1];
  auto codes = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(n * k));
  for (size_t i = 0; i < codes->size(); ++i)
    (*codes)[i] = static_cast<uint8_t>((i * 31 + seed) % 0x7e);
  auto scales = std::make_shared<std::vector<float>>(
      static_cast<size_t>((n + 127) / 128 * ((k + 127) / 128)));
  for (size_t i = 0; i < scales->size(); ++i) (*scales)[i] = static_cast<float>(seed * 1000 + i);
  HostTensor fp8 = like;
  fp8.dtype = DType::kF8E4M3;
  fp8.data = reinterpret_cast<const std::byte*>(codes->data());
  fp8.keep_alive = codes;
  fp8.scale = scales->data();
  fp8.scale_block_n = 128;
  fp8.scale_block_k = 128;
  fp8.scale_keep_alive = scales;
  return fp8;
}

std::vector<std::byte> joined_codes(std::initializer_list<const HostTensor*> parts) {
  std::vector<std::byte> bytes;
  for (const HostTensor* part : parts) {
    bytes.insert(bytes.end(), part->data, part->data + part->numel());
  }
  return bytes;
}

std::vector<std::byte> joined_scales(std::initializer_list<const HostTensor*> parts) {
  std::vector<std::byte> bytes;
  for (const HostTensor* part : parts) {
    const auto* first = reinterpret_cast<const std::byte*>(part->scale);
    bytes.insert(bytes.end(), first, first + part->scale_count() * sizeof(float));
  }
  return bytes;
}

TEST(Fp8Placement, ProjectionsStayOneByteAWeightWithTheirScales) {
  SyntheticCheckpointOptions options;
  options.config_path =
      std::filesystem::path(PDSERVE_SOURCE_DIR) / "tests/data/reference/configs/hd64_gqa4.json";
  options.out_dir = std::filesystem::path(PDSERVE_BINARY_DIR) / "test-models" /
                    ("fp8-placement-" + std::to_string(::getpid()));
  options.seed = 3;
  options.num_layers = 2;
  options.dtype = DType::kBF16;
  options.tokenizer_dir = std::filesystem::path(PDSERVE_ASSETS_DIR) / "qwen3-tokenizer";
  const Result<SyntheticCheckpoint> written = write_synthetic_checkpoint(options);
  ASSERT_TRUE(written.ok()) << written.status().to_string();
  Checkpoint checkpoint = Checkpoint::open(options.out_dir).value();
  Qwen3Weights weights = load_qwen3_weights(checkpoint, DType::kBF16).value();

  size_t expected =
      static_cast<size_t>(weights.embed_tokens.numel() + weights.final_norm.numel()) * 2;
  int seed = 1;
  for (Qwen3LayerWeights& layer : weights.layers) {
    for (HostTensor* norm :
         {&layer.input_layernorm, &layer.post_attention_layernorm, &layer.q_norm, &layer.k_norm}) {
      expected += static_cast<size_t>(norm->numel()) * 2;
    }
    for (HostTensor* projection : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj,
                                   &layer.gate_proj, &layer.up_proj, &layer.down_proj}) {
      *projection = fake_fp8(*projection, seed++);
      expected += static_cast<size_t>(projection->numel()) +
                  static_cast<size_t>(projection->scale_count()) * sizeof(float);
    }
  }
  const Qwen3Weights kept = weights;  // the same host arrays, to compare with
  DeviceStandIn device;
  const Result<std::unique_ptr<Qwen3Model>> model = Qwen3Model::create(device, std::move(weights));
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ(device.allocated(), expected) << "bf16 embeddings and norms, 1-byte projections";
  for (const Qwen3LayerWeights& layer : kept.layers) {
    EXPECT_TRUE(device.holds(joined_codes({&layer.q_proj, &layer.k_proj, &layer.v_proj})));
    EXPECT_TRUE(device.holds(joined_scales({&layer.q_proj, &layer.k_proj, &layer.v_proj})));
    EXPECT_TRUE(device.holds(joined_codes({&layer.gate_proj, &layer.up_proj})));
    EXPECT_TRUE(device.holds(joined_scales({&layer.gate_proj, &layer.up_proj})));
    EXPECT_TRUE(device.holds(joined_codes({&layer.o_proj})));
    EXPECT_TRUE(device.holds(joined_scales({&layer.down_proj})));
  }
  std::filesystem::remove_all(options.out_dir);
}

}  // namespace
}  // namespace pdserve
