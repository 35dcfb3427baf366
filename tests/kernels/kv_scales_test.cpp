// An FP8 KV cache's per-layer scales from a checkpoint (kernels/model/kv_scales.h): vLLM's
// model.layers.{i}.self_attn.k_scale / v_scale tensors, every layer's or none, each one positive
// value. The checkpoints are written here: tiny.json's config (2 layers) and a safetensors file
// holding the tensors each case names.
#include "kernels/model/kv_scales.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/core/dtype.h"
#include "common/model/safetensors_writer.h"

namespace pdserve {
namespace {

struct Tensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

std::filesystem::path write_checkpoint(const std::string& tag, const std::vector<Tensor>& tensors) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("pdserve-kv-scales-" + tag + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(
      std::filesystem::path(PDSERVE_TEST_DATA_DIR) / "reference" / "configs" / "tiny.json",
      dir / "config.json");
  std::vector<SafetensorsEntry> entries;
  for (const Tensor& t : tensors) {
    SafetensorsEntry entry;
    entry.name = t.name;
    entry.dtype = t.dtype;
    entry.shape = t.shape;
    entries.push_back(entry);
  }
  const std::string header = encode_safetensors_header(entries, {});
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  out << header;
  for (const Tensor& t : tensors) {
    std::vector<std::byte> bytes(t.values.size() * dtype_size(t.dtype));
    convert_elements(t.values.data(), DType::kF32, bytes.data(), t.dtype, t.values.size());
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
  return dir;
}

Result<KvScales> scales_of(const std::string& tag, const std::vector<Tensor>& tensors) {
  const std::filesystem::path dir = write_checkpoint(tag, tensors);
  Result<KvScales> scales = kv_scales_for_model(dir, DType::kF8E4M3, 2);
  std::filesystem::remove_all(dir);
  return scales;
}

std::string name(int layer, const char* half) {
  return "model.layers." + std::to_string(layer) + ".self_attn." + half + "_scale";
}

const Tensor kWeight{"model.norm.weight", DType::kBF16, {4}, {1, 1, 1, 1}};

TEST(KvScales, ACheckpointWithoutScalesGivesUnitScales) {
  Result<KvScales> scales = scales_of("none", {kWeight});
  ASSERT_TRUE(scales.ok()) << scales.status().to_string();
  EXPECT_TRUE(scales->k.empty() && scales->v.empty());
  // Other dtypes never read the checkpoint (this folder does not exist).
  EXPECT_TRUE(kv_scales_for_model("/nonexistent", DType::kBF16, 2).ok());
}

TEST(KvScales, EveryLayersScalesAreReadInAnyFloatDtype) {
  Result<KvScales> scales = scales_of("all", {kWeight,
                                              {name(0, "k"), DType::kF32, {}, {0.25f}},
                                              {name(0, "v"), DType::kBF16, {1}, {3.0f}},
                                              {name(1, "k"), DType::kF32, {1}, {0.0125f}},
                                              {name(1, "v"), DType::kF16, {}, {0.5f}}});
  ASSERT_TRUE(scales.ok()) << scales.status().to_string();
  EXPECT_EQ(scales->k, (std::vector<float>{0.25f, 0.0125f}));
  EXPECT_EQ(scales->v, (std::vector<float>{3.0f, 0.5f}));
}

TEST(KvScales, PartialPerHeadAndNonPositiveScalesAreRefused) {
  const Tensor k0{name(0, "k"), DType::kF32, {}, {1.0f}};
  const Tensor v0{name(0, "v"), DType::kF32, {}, {1.0f}};
  const Tensor k1{name(1, "k"), DType::kF32, {}, {1.0f}};
  Result<KvScales> partial = scales_of("partial", {k0, v0, k1});
  ASSERT_FALSE(partial.ok());
  EXPECT_NE(partial.status().message().find("some layers only"), std::string::npos);
  Result<KvScales> per_head =
      scales_of("per-head", {k0, v0, k1, {name(1, "v"), DType::kF32, {2}, {1.0f, 2.0f}}});
  ASSERT_FALSE(per_head.ok());
  EXPECT_NE(per_head.status().message().find("not one"), std::string::npos);
  Result<KvScales> zero = scales_of("zero", {k0, v0, k1, {name(1, "v"), DType::kF32, {}, {0.0f}}});
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("positive"), std::string::npos);
}

}  // namespace
}  // namespace pdserve
