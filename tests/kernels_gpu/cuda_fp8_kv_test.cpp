// The CUDA FP8 KV cache (--kv-cache-dtype fp8, issue #31 item 4) against the CPU FP8 kernels,
// whose own oracles are in tests/kernels/fp8_kv_test.cpp (float64 attention over the
// dequantized cache, every code read exactly). Per scenario, on layer 1 of a two-layer pool with
// per-layer scales that differ:
// - the cache write (qk_norm_rope_kv_write) stores, for every new token, the codes the CPU
//   stores, or a neighbouring code where the rotation's last float bit differs (the CUDA angle
//   is rounded to float before the product, the CPU's is not);
// - paged attention over the same codes (the CPU pool uploaded) and the same q equals the CPU's
//   within 1e-4 of the output scale: prefill tiles, decode with the keys split over blocks
//   (flash-decoding) and head sizes 64, 128 and 256.
// Float32 activations on both (the CPU stand-in run: PDSERVE_GPU_TESTS_ON_CPU=1).
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/core/float8.h"
#include "tests/kernels_gpu/gpu_test_main.h"

namespace pdserve::gpu_test {
namespace {

struct Scenario {
  std::string name;
  int num_heads, num_kv_heads, head_dim, block_size;
  std::vector<int> query_lens, context_lens;
};

constexpr int kLayers = 2;
constexpr int kLayer = 1;
const KvScales kScales{{0.5f, 0.125f}, {2.0f, 0.25f}};

std::vector<float> random_floats(size_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> values(count);
  for (float& v : values) v = dist(rng);
  return values;
}

// The batch on the host: scattered blocks, each sequence's new tokens last in its context.
struct HostBatch {
  std::vector<int32_t> query_start{0}, context_lens, block_tables, positions, slots;
  int max_blocks = 0, num_blocks = 0, tokens = 0, max_query = 0, max_context = 0;

  AttentionBatch view(int num_seqs) {
    return {num_seqs,
            tokens,
            max_blocks,
            max_query,
            max_context,
            query_start.data(),
            context_lens.data(),
            block_tables.data(),
            positions.data(),
            slots.data()};
  }
};

HostBatch make_batch(const Scenario& s) {
  HostBatch b;
  for (size_t i = 0; i < s.query_lens.size(); ++i) {
    b.max_blocks = std::max(b.max_blocks, (s.context_lens[i] + s.block_size - 1) / s.block_size);
    b.max_query = std::max(b.max_query, s.query_lens[i]);
    b.max_context = std::max(b.max_context, s.context_lens[i]);
  }
  b.num_blocks = b.max_blocks * static_cast<int>(s.query_lens.size()) + 1;
  std::vector<int32_t> ids(static_cast<size_t>(b.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(5));
  size_t next = 0;
  for (size_t i = 0; i < s.query_lens.size(); ++i) {
    std::vector<int32_t> table(static_cast<size_t>(b.max_blocks), 0);
    for (int j = 0; j < (s.context_lens[i] + s.block_size - 1) / s.block_size; ++j) {
      table[static_cast<size_t>(j)] = ids[next++];
    }
    b.block_tables.insert(b.block_tables.end(), table.begin(), table.end());
    for (int t = 0; t < s.query_lens[i]; ++t) {
      const int position = s.context_lens[i] - s.query_lens[i] + t;
      b.positions.push_back(position);
      b.slots.push_back(table[static_cast<size_t>(position / s.block_size)] * s.block_size +
                        position % s.block_size);
    }
    b.query_start.push_back(b.query_start.back() + s.query_lens[i]);
    b.context_lens.push_back(s.context_lens[i]);
  }
  b.tokens = b.query_start.back();
  return b;
}

// A pool half of FP8 codes: random values quantized with the layer's scale.
std::vector<uint8_t> random_codes(size_t count, uint32_t seed, float scale) {
  std::vector<uint8_t> codes(count);
  const std::vector<float> values = random_floats(count, seed);
  for (size_t i = 0; i < count; ++i) codes[i] = float_to_fp8_e4m3_saturated(values[i] / scale);
  return codes;
}

class CudaFp8Kv : public ::testing::TestWithParam<Scenario> {};

TEST_P(CudaFp8Kv, CacheWriteAndAttentionMatchTheCpuFp8Kernels) {
  const Scenario& s = GetParam();
  std::unique_ptr<Backend> device = backend_under_test(DType::kF32);
  ASSERT_NE(device, nullptr);
  std::unique_ptr<Backend> cpu = cpu_reference();
  HostBatch b = make_batch(s);
  const int num_seqs = static_cast<int>(s.query_lens.size());
  const int64_t q_width = int64_t{s.num_heads} * s.head_dim;
  const int64_t kv_width = int64_t{s.num_kv_heads} * s.head_dim;
  const KvLayout layout{kLayers,        b.num_blocks, s.block_size,
                        s.num_kv_heads, s.head_dim,   DType::kF8E4M3};
  const size_t half = layout.total_bytes() / 2;
  std::vector<uint8_t> cpu_k = random_codes(half, 1, kScales.k[kLayer]);
  std::vector<uint8_t> cpu_v = random_codes(half, 2, kScales.v[kLayer]);
  const std::vector<uint8_t> initial_k = cpu_k, initial_v = cpu_v;
  const KvCacheView cpu_cache{cpu_k.data(), cpu_v.data(), layout, kScales.k.data(),
                              kScales.v.data()};
  std::vector<float> q = random_floats(static_cast<size_t>(b.tokens * q_width), 3, 2.0f);
  std::vector<float> k = random_floats(static_cast<size_t>(b.tokens * kv_width), 4, 2.0f);
  std::vector<float> v = random_floats(static_cast<size_t>(b.tokens * kv_width), 5);
  std::vector<float> norm = random_floats(static_cast<size_t>(s.head_dim), 6, 0.1f);
  for (float& w : norm) w += 1.0f;
  QkNormRopeParams rope{{norm.data(), DType::kF32, s.head_dim},
                        {norm.data(), DType::kF32, s.head_dim},
                        1e-6f,
                        1000000.0,
                        s.num_heads,
                        s.num_kv_heads,
                        s.head_dim};
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const AttentionBatch cpu_batch = b.view(num_seqs);
  std::vector<float> cpu_q = q, cpu_k_new = k, cpu_v_new = v;
  ASSERT_TRUE(cpu->qk_norm_rope_kv_write(
                     MatrixView::dense(cpu_q.data(), DType::kF32, b.tokens, q_width),
                     MatrixView::dense(cpu_k_new.data(), DType::kF32, b.tokens, kv_width),
                     MatrixView::dense(cpu_v_new.data(), DType::kF32, b.tokens, kv_width), rope,
                     cpu_batch, cpu_cache, kLayer)
                  .ok());
  std::vector<float> expected(cpu_q.size());
  ASSERT_TRUE(
      cpu->paged_attention(MatrixView::dense(cpu_q.data(), DType::kF32, b.tokens, q_width),
                           cpu_batch, cpu_cache, kLayer, s.num_heads, scale,
                           MatrixView::dense(expected.data(), DType::kF32, b.tokens, q_width))
          .ok());

  // The device: the same initial pool, the same new tokens.
  KvCache pool = KvCache::create(*device, layout, kScales).value();
  const KvCacheView cache = pool.view();
  ASSERT_TRUE(device->copy_to_device(cache.k, initial_k.data(), half).ok());
  ASSERT_TRUE(device->copy_to_device(cache.v, initial_v.data(), half).ok());
  DeviceMatrix dq(*device, q, DType::kF32, b.tokens, q_width);
  DeviceMatrix dk(*device, k, DType::kF32, b.tokens, kv_width);
  DeviceMatrix dv(*device, v, DType::kF32, b.tokens, kv_width);
  DeviceMatrix dnorm(*device, norm, DType::kF32, 1, s.head_dim);
  DeviceBuffer query_start = device_ints(*device, b.query_start);
  DeviceBuffer context = device_ints(*device, b.context_lens);
  DeviceBuffer tables = device_ints(*device, b.block_tables);
  DeviceBuffer positions = device_ints(*device, b.positions);
  DeviceBuffer slots = device_ints(*device, b.slots);
  AttentionBatch batch = cpu_batch;
  batch.query_start = query_start.as<int32_t>();
  batch.context_lens = context.as<int32_t>();
  batch.block_tables = tables.as<int32_t>();
  batch.positions = positions.as<int32_t>();
  batch.slot_mapping = slots.as<int32_t>();
  rope.q_norm_weight = dnorm.vector();
  rope.k_norm_weight = dnorm.vector();
  ASSERT_TRUE(
      device->qk_norm_rope_kv_write(dq.view(), dk.view(), dv.view(), rope, batch, cache, kLayer)
          .ok());
  std::vector<uint8_t> device_k(half), device_v(half);
  ASSERT_TRUE(device->copy_to_host(device_k.data(), cache.k, half).ok());
  ASSERT_TRUE(device->copy_to_host(device_v.data(), cache.v, half).ok());
  ASSERT_TRUE(device->synchronize().ok());
  int neighbours = 0;
  for (size_t i = 0; i < half; ++i) {
    for (const auto& [got, want] : {std::pair{device_k[i], cpu_k[i]}, {device_v[i], cpu_v[i]}}) {
      if (got == want) continue;
      // A neighbouring code of the same sign (codes are ordered by magnitude within a sign).
      ASSERT_TRUE((got & 0x80) == (want & 0x80) && std::abs((got & 0x7f) - (want & 0x7f)) == 1)
          << s.name << " pool byte " << i << ": code " << int{got} << " vs " << int{want};
      ++neighbours;
    }
  }

  // Attention over the CPU's codes and q.
  ASSERT_TRUE(device->copy_to_device(cache.k, cpu_k.data(), half).ok());
  ASSERT_TRUE(device->copy_to_device(cache.v, cpu_v.data(), half).ok());
  DeviceMatrix rotated(*device, cpu_q, DType::kF32, b.tokens, q_width);
  DeviceMatrix out = DeviceMatrix::poisoned(*device, DType::kF32, b.tokens, q_width);
  ASSERT_TRUE(
      device->paged_attention(rotated.view(), batch, cache, kLayer, s.num_heads, scale, out.view())
          .ok());
  ASSERT_TRUE(device->synchronize().ok());
  const std::vector<float> actual = out.download();
  double output_scale = 1.0;
  for (const float e : expected) output_scale = std::max(output_scale, double{std::fabs(e)});
  double worst = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_FALSE(std::isnan(actual[i])) << s.name << " element " << i << " not written";
    worst = std::max(worst, std::fabs(double{actual[i]} - expected[i]));
  }
  EXPECT_LE(worst, 1e-4 * output_scale) << s.name;
  std::printf(
      "  %-28s cache write: %d neighbouring codes of %zu; attention max abs error %.3g "
      "(scale %.3g)\n",
      s.name.c_str(), neighbours, 2 * static_cast<size_t>(b.tokens * kv_width), worst,
      output_scale);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaFp8Kv,
    ::testing::Values(
        Scenario{"decode_gqa2_splitk", 16, 8, 128, 16, {1, 1, 1, 1}, {1, 17, 1000, 2049}},
        Scenario{"decode_mha_hd64", 4, 4, 64, 32, {1, 1}, {33, 64}},
        Scenario{"prefill_chunks_over_cache", 16, 8, 128, 16, {37, 64, 1}, {100, 64, 700}},
        Scenario{"prefill_gqa16_hd256", 16, 1, 256, 8, {20}, {45}}),
    [](const ::testing::TestParamInfo<Scenario>& param_info) { return param_info.param.name; });

}  // namespace
}  // namespace pdserve::gpu_test

int main(int argc, char** argv) {
  return pdserve::gpu_test::run_main(argc, argv);
}
