// The GPU kernel checks' host half, proven on the CPU: the per-row error measure, the
// double-precision references against the CPU backend (which every backend is held to), and
// that the planted inputs make a kernel that drops one key at a block or split boundary fail
// the tolerance the GPU tests use, where one absolute bound against the output's largest
// value would let it pass.
#include "tests/kernels_gpu/kernel_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/core/dtype.h"
#include "kernels/backend.h"

namespace pdserve {
namespace {

using kernel_check::PagedProblem;
using kernel_check::RowErrors;

// The tolerances cuda_strict_test holds the float32 attention to (per row, relative).
constexpr double kFloat32AttentionTolerance = 5e-5;

std::unique_ptr<Backend> cpu_backend() {
  return std::move(create_backend(BackendOptions{})).value();
}

// uniform_floats fills on every core; its values are one SplitMix64 stream stepped on one
// thread, whatever the thread count.
TEST(UniformFloats, EqualOneSerialSplitMix64Stream) {
  const size_t count = 300007;
  const std::vector<float> values = kernel_check::uniform_floats(count, 51, 0.25f);
  ASSERT_EQ(values.size(), count);
  uint64_t state = 51;
  for (size_t i = 0; i < count; ++i) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float expected =
        (static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f) * 0.25f;
    ASSERT_EQ(values[i], expected) << "element " << i;
  }
  const std::vector<float> rounded = kernel_check::rounded_to(values, DType::kBF16);
  for (size_t i = 0; i < count; i += 9973) {
    EXPECT_EQ(rounded[i], bf16_to_float(float_to_bf16(values[i]))) << "element " << i;
  }
}

// The CPU backend's paged attention on the problem (its K/V pools in the problem's KV dtype).
std::vector<float> cpu_attention(Backend& cpu, PagedProblem& p) {
  const size_t pool = p.k_pool.size();
  std::vector<std::byte> k_bytes(pool * dtype_size(p.layout.dtype));
  std::vector<std::byte> v_bytes(pool * dtype_size(p.layout.dtype));
  convert_elements(p.k_pool.data(), DType::kF32, k_bytes.data(), p.layout.dtype, pool);
  convert_elements(p.v_pool.data(), DType::kF32, v_bytes.data(), p.layout.dtype, pool);
  const KvCacheView cache{k_bytes.data(), v_bytes.data(), p.layout};
  const AttentionBatch batch{p.num_seqs(),          p.num_tokens(),        p.max_blocks_per_seq,
                             p.max_query_len,       p.max_context_len,     p.query_start.data(),
                             p.context_lens.data(), p.block_tables.data(), p.positions.data(),
                             p.slot_mapping.data()};
  std::vector<float> out(static_cast<size_t>(p.num_tokens() * p.q_width()));
  const Status status =
      cpu.paged_attention(MatrixView::dense(p.q.data(), DType::kF32, p.num_tokens(), p.q_width()),
                          batch, cache, 0, p.num_heads, p.scale,
                          MatrixView::dense(out.data(), DType::kF32, p.num_tokens(), p.q_width()));
  EXPECT_TRUE(status.ok()) << status.to_string();
  return out;
}

std::vector<float> as_floats(const std::vector<double>& values) {
  return {values.begin(), values.end()};
}

TEST(RowErrors, HoldEveryRowToTheSameRelativePrecision) {
  // Row 0 is 1000x larger than row 1; row 1 is 10% off. An absolute bound of 1e-2 times the
  // largest value passes it; the per-row measure does not.
  const std::vector<double> expected = {1000, -2000, 1000, 1, -2, 1};
  const std::vector<float> actual = {1000, -2000, 1000, 1.1f, -2.2f, 1.1f};
  const RowErrors errors = kernel_check::row_errors(actual, expected, 2, 3);
  EXPECT_NEAR(errors.relative[0], 0.0, 1e-12);
  EXPECT_NEAR(errors.relative[1], 0.1, 1e-6);
  EXPECT_EQ(errors.worst_row, 1);
  EXPECT_FALSE(errors.within(1e-2));
  double largest = 0;
  for (double e : expected) largest = std::max(largest, std::fabs(e));
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_LE(std::fabs(actual[i] - expected[i]), 1e-2 * largest) << "the absolute bound passes";
  }
}

TEST(RowErrors, UnwrittenElementsAndZeroRows) {
  const std::vector<double> expected = {0, 0, 1, 1};
  const std::vector<float> actual = {0, 0, std::nanf(""), 1};
  const RowErrors errors = kernel_check::row_errors(actual, expected, 2, 2);
  EXPECT_EQ(errors.relative[0], 0.0) << "an all-zero row matched exactly";
  EXPECT_TRUE(std::isinf(errors.relative[1]));
  EXPECT_EQ(errors.unwritten, 1);
  EXPECT_FALSE(errors.within(1.0));
  EXPECT_NE(errors.describe().find("1 elements never written"), std::string::npos)
      << errors.describe();
  const std::vector<float> off = {0, 0.5f, 1, 1};
  EXPECT_NEAR(kernel_check::row_errors(off, expected, 2, 2).relative[0], 0.5, 1e-12)
      << "an all-zero expected row is measured absolutely";
}

TEST(ReferenceLinear, EqualsTheCpuBackendInFloat32) {
  const int64_t m = 5, n = 300, k = 1536;
  std::vector<float> x = kernel_check::uniform_floats(static_cast<size_t>(m * k), 1);
  std::vector<float> w = kernel_check::uniform_floats(static_cast<size_t>(n * k), 2, 0.05f);
  std::vector<float> y(static_cast<size_t>(m * n));
  std::unique_ptr<Backend> cpu = cpu_backend();
  ASSERT_TRUE(cpu->linear(MatrixView::dense(x.data(), DType::kF32, m, k),
                          MatrixView::dense(w.data(), DType::kF32, n, k),
                          MatrixView::dense(y.data(), DType::kF32, m, n))
                  .ok());
  const std::vector<int64_t> rows = {0, 1, 2, 3, 4};
  const RowErrors errors =
      kernel_check::row_errors(y, kernel_check::reference_linear(x, w, n, k, rows), m, n);
  EXPECT_TRUE(errors.within(1e-6)) << errors.describe();
  // A sampled row alone is the same row (the GPU tests check a sample of large GEMMs).
  const std::vector<int64_t> third = {3};
  const std::vector<float> y3(y.begin() + 3 * n, y.begin() + 4 * n);
  EXPECT_TRUE(kernel_check::row_errors(y3, kernel_check::reference_linear(x, w, n, k, third), 1, n)
                  .within(1e-6));
}

TEST(BoundaryPositions, CoverSplitsBlocksAndEnds) {
  const std::vector<int> positions = kernel_check::boundary_positions(1000, 16, 256, 64);
  for (int wanted : {0, 999, 255, 256, 511, 512, 767, 768}) {
    EXPECT_TRUE(std::binary_search(positions.begin(), positions.end(), wanted)) << wanted;
  }
  EXPECT_TRUE(std::is_sorted(positions.begin(), positions.end()));
  EXPECT_EQ(std::adjacent_find(positions.begin(), positions.end()), positions.end());
  const std::vector<int> few = kernel_check::boundary_positions(32768, 16, 512, 6);
  EXPECT_EQ(few.size(), 6u);
  EXPECT_EQ(few.back(), 32767) << "the ends come first";
  EXPECT_EQ(few.front(), 0);
  EXPECT_EQ(kernel_check::boundary_positions(1, 16, 256, 8), std::vector<int>{0});
}

struct AttentionCase {
  std::string name;
  int num_heads, num_kv_heads, head_dim, block_size, keys_per_split;
  std::vector<int> query_lens, context_lens;
  DType kv_dtype;
};

class PlantedAttention : public ::testing::TestWithParam<AttentionCase> {};

// The double-precision reference equals the CPU backend on planted problems (so it can
// stand in for it on the GPU), the planted keys dominate, and dropping any one of them moves
// some row by far more than the tolerance.
TEST_P(PlantedAttention, ReferenceMatchesTheCpuAndCatchesADroppedKey) {
  const AttentionCase& c = GetParam();
  PagedProblem p = kernel_check::make_paged_problem(c.num_heads, c.num_kv_heads, c.head_dim,
                                                    c.block_size, c.query_lens, c.context_lens,
                                                    DType::kF32, c.kv_dtype, 11, true);
  std::vector<std::vector<int>> planted;
  for (int context : c.context_lens) {
    planted.push_back(
        kernel_check::boundary_positions(context, c.block_size, c.keys_per_split, 12));
  }
  kernel_check::plant_peaked_keys(p, planted, 20.0f, false, 12);
  const std::vector<double> reference = kernel_check::reference_attention(p);
  std::unique_ptr<Backend> cpu = cpu_backend();
  const std::vector<float> cpu_out = cpu_attention(*cpu, p);
  const RowErrors errors =
      kernel_check::row_errors(cpu_out, reference, p.num_tokens(), p.q_width());
  EXPECT_TRUE(errors.within(kFloat32AttentionTolerance)) << errors.describe();

  // Planted keys of the first sequence (up to four, spread: each costs a whole reference),
  // dropped, fail the float32 tolerance by 100x.
  const std::vector<int>& first = planted.front();
  std::vector<int> dropped_positions;
  for (size_t i = 0; i < 4 && i < first.size(); ++i) {
    dropped_positions.push_back(
        first[i * (first.size() - 1) / std::max<size_t>(1, std::min<size_t>(3, first.size() - 1))]);
  }
  for (int position : dropped_positions) {
    const std::vector<double> dropped = kernel_check::reference_attention(p, position);
    const RowErrors caught =
        kernel_check::row_errors(as_floats(dropped), reference, p.num_tokens(), p.q_width());
    EXPECT_GT(caught.worst, 100 * kFloat32AttentionTolerance)
        << "dropping key " << position << " goes unnoticed: " << caught.describe();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PlantedAttention,
    ::testing::Values(
        AttentionCase{"decode_gqa4_boundaries",
                      32,
                      8,
                      128,
                      16,
                      256,
                      {1, 1, 1, 1, 1, 1},
                      {1, 17, 256, 257, 1000, 4097},
                      DType::kF32},
        AttentionCase{"decode_32k", 32, 8, 128, 16, 512, {1}, {32768}, DType::kF32},
        AttentionCase{"decode_bf16_kv_hd64", 8, 2, 64, 32, 256, {1, 1}, {2048, 513}, DType::kBF16},
        AttentionCase{
            "prefill_chunk_over_cache", 16, 8, 128, 16, 0, {48, 3}, {300, 40}, DType::kF32},
        AttentionCase{"prefill_gqa16_hd256", 16, 1, 256, 8, 0, {20}, {45}, DType::kBF16}),
    [](const ::testing::TestParamInfo<AttentionCase>& param_info) {
      return param_info.param.name;
    });

// One sequence's values are 1000x smaller than another's: a key dropped there stays under an
// absolute bound of 1e-2 of the largest output value, and the per-row measure catches it.
TEST(PlantedAttention, RowScalesExposeErrorsInSmallRows) {
  PagedProblem p = kernel_check::make_paged_problem(4, 4, 64, 16, {1, 1}, {64, 64}, DType::kF32,
                                                    DType::kF32, 3, false);
  for (int position = 0; position < 64; ++position) {
    for (int h = 0; h < 4; ++h) {
      float* v = p.v_pool.data() + p.key_offset(0, position) + h * 64;
      for (int d = 0; d < 64; ++d) v[d] *= 1e-3f;
    }
  }
  const std::vector<std::vector<int>> planted = {{15, 16, 63}, {15, 16, 63}};
  kernel_check::plant_peaked_keys(p, planted, 20.0f, false, 4);
  const std::vector<double> reference = kernel_check::reference_attention(p);
  const std::vector<double> dropped = kernel_check::reference_attention(p, 16);
  double largest = 0.0;
  for (double value : reference) largest = std::max(largest, std::fabs(value));
  bool absolute_passes = true;
  for (size_t i = 0; i < reference.size() / 2; ++i) {  // sequence 0's row
    absolute_passes &= std::fabs(dropped[i] - reference[i]) <= 1e-2 * largest;
  }
  EXPECT_TRUE(absolute_passes) << "the small row hides under the absolute bound";
  const RowErrors errors =
      kernel_check::row_errors(as_floats(dropped), reference, p.num_tokens(), p.q_width());
  EXPECT_EQ(errors.worst_row, 0);
  EXPECT_GT(errors.relative[0], 0.1) << errors.describe();
}

// With `single`, the last planted key dominates: the output is its value.
TEST(PlantedAttention, ASinglePlantedKeyDominates) {
  PagedProblem p = kernel_check::make_paged_problem(8, 2, 128, 16, {1}, {5000}, DType::kF32,
                                                    DType::kF32, 5, false);
  const std::vector<std::vector<int>> planted = {{255, 256, 4095}};
  kernel_check::plant_peaked_keys(p, planted, 20.0f, true, 6);
  const std::vector<double> reference = kernel_check::reference_attention(p);
  for (int head = 0; head < 8; ++head) {
    const float* v = p.v_pool.data() + p.key_offset(0, 4095) + (head / 4) * 128;
    std::vector<float> out(reference.begin() + head * 128, reference.begin() + (head + 1) * 128);
    const std::vector<double> value(v, v + 128);
    EXPECT_TRUE(kernel_check::row_errors(out, value, 1, 128).within(1e-3)) << "head " << head;
  }
}

}  // namespace
}  // namespace pdserve
