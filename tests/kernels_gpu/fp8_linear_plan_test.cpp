// The host half of the CUDA FP8 linear layer (issue #31 item 3), run everywhere: the path
// chosen by compute capability, cuBLASLt version and weight format; cuBLASLt's tile-scale grid
// against the representation's dequantization rule for every element; the workspace layout;
// and the activation quantization's host reference (the CUDA kernel's specification) against
// numpy + ml_dtypes goldens (tests/reference/fp8_group_quant_goldens.py).
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/fp8_activation_quant.h"
#include "kernels/fp8_linear_plan.h"
#include "kernels/model/fp8_scale_concat.h"

namespace pdserve {
namespace {

constexpr Fp8Device kHopper{9, 0, 130000};
const Fp8WeightShape kBlock128{4096, 4096, 128, 128};

Fp8GemmPath path_of(const Fp8WeightShape& weight, const Fp8Device& device,
                    DType activations = DType::kBF16, DType out = DType::kBF16) {
  const Fp8GemmChoice choice = choose_fp8_gemm_path(weight, device, activations, out);
  EXPECT_FALSE(choice.reason.empty());
  return choice.path;
}

TEST(Fp8GemmPathChoice, BlockScaledOnlyOnHopperWithCublasLt129) {
  EXPECT_EQ(path_of(kBlock128, kHopper), Fp8GemmPath::kBlockScaledLt);
  EXPECT_EQ(path_of(kBlock128, {9, 0, 120900}), Fp8GemmPath::kBlockScaledLt);
  EXPECT_EQ(path_of(kBlock128, {9, 0, 120800}), Fp8GemmPath::kDequantize);
  // Ampere, Ada (per-tensor FP8 only), Blackwell (MX block scaling only): the fallback.
  for (const Fp8Device device : {Fp8Device{8, 0, 130000}, Fp8Device{8, 9, 130000},
                                 Fp8Device{10, 0, 130000}, Fp8Device{12, 0, 130000}}) {
    const Fp8GemmChoice choice =
        choose_fp8_gemm_path(kBlock128, device, DType::kBF16, DType::kBF16);
    EXPECT_EQ(choice.path, Fp8GemmPath::kDequantize) << device.major << "." << device.minor;
    EXPECT_NE(choice.reason.find("compute capability"), std::string::npos) << choice.reason;
  }
}

TEST(Fp8GemmPathChoice, StrictFloat32AndFloat32OutputDequantize) {
  EXPECT_EQ(path_of(kBlock128, kHopper, DType::kF32, DType::kF32), Fp8GemmPath::kDequantize);
  EXPECT_EQ(path_of(kBlock128, kHopper, DType::kBF16, DType::kF32), Fp8GemmPath::kDequantize);
}

TEST(Fp8GemmPathChoice, ScaleBlocksMustHoldWhole128Tiles) {
  // Per-tensor (one block the whole matrix) and multiples of 128 map onto 128x128 tiles.
  EXPECT_EQ(path_of({4096, 4096, 4096, 4096}, kHopper), Fp8GemmPath::kBlockScaledLt);
  EXPECT_EQ(path_of({4096, 4096, 256, 512}, kHopper), Fp8GemmPath::kBlockScaledLt);
  // Per-channel scales and finer blocks differ inside a tile.
  EXPECT_EQ(path_of({4096, 4096, 1, 4096}, kHopper), Fp8GemmPath::kDequantize);
  EXPECT_EQ(path_of({4096, 4096, 64, 128}, kHopper), Fp8GemmPath::kDequantize);
  EXPECT_EQ(path_of({4096, 4096, 128, 64}, kHopper), Fp8GemmPath::kDequantize);
  // FP8 tensor cores need n and k multiples of 16.
  EXPECT_EQ(path_of({4112, 4096, 128, 128}, kHopper), Fp8GemmPath::kBlockScaledLt);
  EXPECT_EQ(path_of({4100, 4096, 128, 128}, kHopper), Fp8GemmPath::kDequantize);
  EXPECT_EQ(path_of({4096, 4100, 128, 128}, kHopper), Fp8GemmPath::kDequantize);
}

TEST(Fp8GemmPathChoice, EveryQwen3ProjectionTakesTheFastPathOnHopper) {
  // Qwen3-0.6B (hidden 1024, 16/8 heads of 128, ffn 3072) and 8B (4096, 32/8, 12288), fused
  // q/k/v and gate/up as the model stores them.
  for (const auto& [hidden, heads, kv_heads, ffn] :
       {std::tuple{1024, 16, 8, 3072}, std::tuple{4096, 32, 8, 12288}}) {
    const int64_t qkv = (heads + 2 * kv_heads) * 128;
    for (const auto& [n, k] : {std::pair<int64_t, int64_t>{qkv, hidden},
                               {hidden, heads * 128},
                               {2 * ffn, hidden},
                               {hidden, ffn}}) {
      EXPECT_EQ(path_of({n, k, 128, 128}, kHopper), Fp8GemmPath::kBlockScaledLt) << n << "x" << k;
    }
  }
}

// Every element's tile scale equals the representation's scale for it (qwen3_weights.h:
// scale[(i / block_n) * ceil(k / block_k) + j / block_k]), partial tiles included; padding 0.
void expect_tiles_match(const Fp8WeightShape& weight) {
  const int64_t scale_rows = (weight.n + weight.scale_block_n - 1) / weight.scale_block_n;
  const int64_t scale_cols = (weight.k + weight.scale_block_k - 1) / weight.scale_block_k;
  std::vector<float> scales(static_cast<size_t>(scale_rows * scale_cols));
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.5f + static_cast<float>(i);
  const std::vector<float> grid = fp8_tile_scales(weight, scales.data());
  const int64_t stride = fp8_tile_scale_stride(weight.k);
  const int64_t tile_rows = (weight.n + 127) / 128;
  const int64_t tile_cols = (weight.k + 127) / 128;
  ASSERT_EQ(grid.size(), static_cast<size_t>(tile_rows * stride));
  EXPECT_EQ(stride % 4, 0);
  EXPECT_GE(stride, tile_cols);
  for (int64_t i = 0; i < weight.n; ++i) {
    for (int64_t j = 0; j < weight.k; ++j) {
      const float wanted = scales[static_cast<size_t>((i / weight.scale_block_n) * scale_cols +
                                                      j / weight.scale_block_k)];
      const float tile = grid[static_cast<size_t>((i / 128) * stride + j / 128)];
      ASSERT_EQ(tile, wanted) << "element " << i << "," << j << " of " << weight.n << "x"
                              << weight.k << " blocks " << weight.scale_block_n << "x"
                              << weight.scale_block_k;
    }
  }
  for (int64_t ti = 0; ti < tile_rows; ++ti) {
    for (int64_t tj = tile_cols; tj < stride; ++tj) {
      EXPECT_EQ(grid[static_cast<size_t>(ti * stride + tj)], 0.0f);
    }
  }
}

TEST(Fp8TileScales, MatchTheRepresentationForEveryElement) {
  expect_tiles_match({300, 520, 128, 128});   // partial tiles both ways, stride 5 -> 8
  expect_tiles_match({256, 1024, 128, 128});  // stride exactly 8
  expect_tiles_match({384, 640, 256, 384});   // coarser blocks
  expect_tiles_match({272, 400, 272, 400});   // per-tensor
}

TEST(Fp8Workspace, PartsAreAlignedDisjointAndLargeEnough) {
  const Fp8WeightShape weight{6144, 4096, 128, 128};
  for (const int64_t m : {int64_t{1}, int64_t{37}, int64_t{8192}}) {
    const Fp8Workspace block =
        plan_fp8_workspace(Fp8GemmPath::kBlockScaledLt, weight, m, DType::kBF16);
    EXPECT_EQ(block.activations_offset, 0u);
    EXPECT_EQ(block.activation_scales_offset % 256, 0u);
    EXPECT_EQ(block.tile_scales_offset % 256, 0u);
    EXPECT_GE(block.activation_scales_offset, static_cast<size_t>(m * weight.k));
    EXPECT_GE(block.tile_scales_offset,
              block.activation_scales_offset + static_cast<size_t>(32 * m) * sizeof(float));
    EXPECT_GE(block.bytes, block.tile_scales_offset + 48 * 32 * sizeof(float));
    EXPECT_EQ(block.bytes % 256, 0u);
  }
  const Fp8Workspace bf16 = plan_fp8_workspace(Fp8GemmPath::kDequantize, weight, 37, DType::kBF16);
  EXPECT_EQ(bf16.bytes, size_t{6144} * 4096 * 2);
  const Fp8Workspace f32 = plan_fp8_workspace(Fp8GemmPath::kDequantize, weight, 1, DType::kF32);
  EXPECT_EQ(f32.bytes, size_t{6144} * 4096 * 4);
}

// Every element of the concatenated matrix keeps its part's scale (the representation's rule
// on both sides).
void expect_concatenation_keeps_scales(const std::vector<Fp8ScalePart>& parts,
                                       int64_t expected_block_n) {
  const Result<Fp8ScaleGrid> grid = concatenate_fp8_scales(parts);
  ASSERT_TRUE(grid.ok()) << grid.status().to_string();
  EXPECT_EQ(grid->block_n, expected_block_n);
  const int64_t cols = parts.front().cols;
  const int64_t grid_cols = (cols + grid->block_k - 1) / grid->block_k;
  int64_t total_rows = 0;
  for (const Fp8ScalePart& part : parts) total_rows += part.rows;
  ASSERT_EQ(grid->scales.size(),
            static_cast<size_t>(((total_rows + grid->block_n - 1) / grid->block_n) * grid_cols));
  int64_t first_row = 0;
  for (const Fp8ScalePart& part : parts) {
    const int64_t part_cols = (cols + part.block_k - 1) / part.block_k;
    for (int64_t i = 0; i < part.rows; ++i) {
      for (int64_t j = 0; j < cols; j += 7) {
        const float want = part.scales[(i / part.block_n) * part_cols + j / part.block_k];
        const int64_t row = first_row + i;
        ASSERT_EQ(grid->scales[static_cast<size_t>((row / grid->block_n) * grid_cols +
                                                   j / grid->block_k)],
                  want)
            << "row " << row << " col " << j;
      }
    }
    first_row += part.rows;
  }
}

TEST(Fp8ScaleConcat, QwenBlocksStackAndOtherLayoutsGoPerRow) {
  std::vector<float> q(32 * 8), k(8 * 8), v(8 * 8), tensor_a{0.5f}, tensor_b{2.0f};
  for (size_t i = 0; i < q.size(); ++i) q[i] = 1.0f + static_cast<float>(i);
  for (size_t i = 0; i < k.size(); ++i) k[i] = 1000.0f + static_cast<float>(i);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 2000.0f + static_cast<float>(i);
  // Qwen3-8B's q/k/v: 4096 + 1024 + 1024 rows of 1024 (shortened k), 128x128 blocks.
  expect_concatenation_keeps_scales({{4096, 1000, q.data(), 128, 128},
                                     {1024, 1000, k.data(), 128, 128},
                                     {1024, 1000, v.data(), 128, 128}},
                                    128);
  // Per-tensor parts of different heights: one scale per row.
  expect_concatenation_keeps_scales(
      {{300, 256, tensor_a.data(), 300, 256}, {100, 256, tensor_b.data(), 100, 256}}, 1);
  // A part whose rows end inside a block.
  expect_concatenation_keeps_scales(
      {{200, 1000, q.data(), 128, 128}, {128, 1000, k.data(), 128, 128}}, 1);
  // Widths and block widths must agree.
  EXPECT_FALSE(concatenate_fp8_scales(std::vector<Fp8ScalePart>{{128, 256, q.data(), 128, 128},
                                                                {128, 512, k.data(), 128, 128}})
                   .ok());
  EXPECT_EQ(concatenate_fp8_scales(std::vector<Fp8ScalePart>{{128, 256, q.data(), 128, 128},
                                                             {128, 256, k.data(), 128, 256}})
                .status()
                .code(),
            StatusCode::kUnimplemented);
  EXPECT_FALSE(
      concatenate_fp8_scales(std::vector<Fp8ScalePart>{{128, 256, nullptr, 128, 128}}).ok());
}

struct QuantCase {
  int64_t m = 0;
  int64_t k = 0;
  std::vector<float> x;
  std::vector<float> scales;
  std::vector<uint8_t> q;
};

std::vector<QuantCase> read_quant_goldens() {
  std::ifstream in(std::string(PDSERVE_TEST_DATA_DIR) + "/fp8_group_quant_ml_dtypes.txt");
  std::vector<QuantCase> cases;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string kind;
    fields >> kind;
    if (kind == "case") {
      cases.emplace_back();
      fields >> cases.back().m >> cases.back().k;
      continue;
    }
    QuantCase& current = cases.back();
    std::string word;
    while (fields >> word) {
      if (kind == "q") {
        current.q.push_back(static_cast<uint8_t>(std::stoul(word)));
      } else {
        const float value =
            std::bit_cast<float>(static_cast<uint32_t>(std::stoul(word, nullptr, 16)));
        (kind == "x" ? current.x : current.scales).push_back(value);
      }
    }
  }
  return cases;
}

TEST(Fp8ActivationQuant, ReferenceEqualsNumpyAndMlDtypesBitForBit) {
  const std::vector<QuantCase> cases = read_quant_goldens();
  ASSERT_EQ(cases.size(), 3u) << "tests/data/fp8_group_quant_ml_dtypes.txt";
  for (const QuantCase& c : cases) {
    const int64_t groups = (c.k + kFp8ActivationGroup - 1) / kFp8ActivationGroup;
    ASSERT_EQ(c.x.size(), static_cast<size_t>(c.m * c.k));
    ASSERT_EQ(c.scales.size(), static_cast<size_t>(groups * c.m));
    ASSERT_EQ(c.q.size(), static_cast<size_t>(c.m * c.k));
    // Through a strided view: the kernel reads activations with their row stride.
    const int64_t stride = c.k + 3;
    std::vector<float> strided(static_cast<size_t>(c.m * stride), -1e30f);
    for (int64_t r = 0; r < c.m; ++r) {
      for (int64_t j = 0; j < c.k; ++j) strided[r * stride + j] = c.x[r * c.k + j];
    }
    std::vector<uint8_t> q(c.q.size());
    std::vector<float> scales(c.scales.size());
    quantize_fp8_token_groups_reference(strided.data(), c.m, c.k, stride, q.data(), scales.data());
    for (size_t i = 0; i < scales.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(scales[i]), std::bit_cast<uint32_t>(c.scales[i]))
          << c.m << "x" << c.k << " scale " << i;
    }
    int differing = 0;
    for (size_t i = 0; i < q.size(); ++i) differing += q[i] != c.q[i];
    EXPECT_EQ(differing, 0) << c.m << "x" << c.k;
  }
}

}  // namespace
}  // namespace pdserve
