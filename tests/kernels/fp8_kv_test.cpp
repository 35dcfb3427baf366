// The FP8 E4M3 KV cache (--kv-cache-dtype fp8) of the CPU backend, at every level the CPU
// has: the cache write stores saturate(x / scale) of the layer's scale, and paged attention
// over the stored codes equals a float64 attention over the dequantized cache (code * scale;
// bound 1e-5 of the largest output, as for the other dtypes), equals it exactly for every one
// of the 256 codes, and stays within a bound derived from the quantization error of the
// bf16-KV result of the same inputs. The oracles: float8.h's encoder (checked exhaustively
// against ml_dtypes in tests/core/float8_test.cpp) and double arithmetic written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/core/dtype.h"
#include "common/core/float8.h"
#include "kernels/backend.h"
#include "kernels/cpu_backend.h"
#include "kernels/model/kv_cache.h"

namespace pdserve {
namespace {

std::vector<float> random_floats(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = dist(rng);
  return values;
}

// Sequences of `lengths` tokens in consecutive pool blocks of a two-layer pool, written and
// read in layer 1 (so that a kernel using layer 0's scale shows).
struct Shape {
  int num_heads;
  int num_kv_heads;
  int head_dim;
  int block_size;
  std::vector<int> lengths;
};

constexpr int kLayer = 1;
const std::vector<float> kKScales = {0.5f, 0.0625f};
const std::vector<float> kVScales = {2.0f, 0.004f};  // small: some V values saturate
// Scales that no value of these inputs exceeds by 448 times: quantization error alone.
const std::vector<float> kUnsaturatedKScales = {0.5f, 0.25f};
const std::vector<float> kUnsaturatedVScales = {2.0f, 0.5f};

struct KvRun {
  std::vector<float> q;         // after the norm and rotation
  std::vector<float> out;       // attention of every token over its prefix
  std::vector<float> decode;    // attention of each sequence's last token alone
  std::vector<std::byte> k, v;  // the pool's halves
  KvLayout layout;
  std::vector<int32_t> slots;
  std::vector<float> k_scales, v_scales;  // of an FP8 pool
};

struct Batch {
  std::vector<int32_t> query_start{0}, context_lens, block_tables, positions, slots;
  int max_blocks = 0;
  AttentionBatch view;
};

Batch whole_prompts(const Shape& s) {
  Batch b;
  for (const int length : s.lengths) {
    b.max_blocks = std::max(b.max_blocks, (length + s.block_size - 1) / s.block_size);
  }
  int first_block = 0;
  for (const int length : s.lengths) {
    b.query_start.push_back(b.query_start.back() + length);
    b.context_lens.push_back(length);
    for (int i = 0; i < b.max_blocks; ++i) b.block_tables.push_back(first_block + i);
    for (int t = 0; t < length; ++t) {
      b.positions.push_back(t);
      b.slots.push_back(first_block * s.block_size + t);
    }
    first_block += b.max_blocks;
  }
  b.view.num_seqs = static_cast<int>(s.lengths.size());
  b.view.num_tokens = b.query_start.back();
  b.view.max_query_len = *std::max_element(s.lengths.begin(), s.lengths.end());
  b.view.max_context_len = b.view.max_query_len;
  b.view.max_blocks_per_seq = b.max_blocks;
  b.view.query_start = b.query_start.data();
  b.view.context_lens = b.context_lens.data();
  b.view.block_tables = b.block_tables.data();
  b.view.positions = b.positions.data();
  b.view.slot_mapping = b.slots.data();
  return b;
}

// The last token of every sequence as one decode step over the same blocks.
Batch last_tokens(const Batch& prompts) {
  Batch b = prompts;
  b.query_start = {0};
  b.positions.clear();
  b.slots.clear();
  for (size_t s = 0; s < prompts.context_lens.size(); ++s) {
    b.query_start.push_back(static_cast<int32_t>(s + 1));
    b.positions.push_back(prompts.context_lens[s] - 1);
    b.slots.push_back(prompts.slots[static_cast<size_t>(prompts.query_start[s + 1] - 1)]);
  }
  b.view.num_tokens = static_cast<int>(prompts.context_lens.size());
  b.view.max_query_len = 1;
  b.view.query_start = b.query_start.data();
  b.view.context_lens = b.context_lens.data();
  b.view.block_tables = b.block_tables.data();
  b.view.positions = b.positions.data();
  b.view.slot_mapping = b.slots.data();
  return b;
}

KvRun run(Backend& backend, const Shape& s, DType kv_dtype, uint32_t seed,
          const std::vector<float>& k_scales = kKScales,
          const std::vector<float>& v_scales = kVScales) {
  Batch prompts = whole_prompts(s);
  const int tokens = prompts.view.num_tokens;
  KvRun r;
  r.layout = {2,
              prompts.max_blocks * static_cast<int>(s.lengths.size()),
              s.block_size,
              s.num_kv_heads,
              s.head_dim,
              kv_dtype};
  r.slots = prompts.slots;
  r.k.assign(r.layout.total_bytes() / 2, std::byte{0});
  r.v.assign(r.layout.total_bytes() / 2, std::byte{0});
  KvCacheView cache{r.k.data(), r.v.data(), r.layout};
  r.k_scales = k_scales;
  r.v_scales = v_scales;
  if (kv_dtype == DType::kF8E4M3) {
    cache.k_scales = r.k_scales.data();
    cache.v_scales = r.v_scales.data();
  }
  const int64_t q_width = int64_t{s.num_heads} * s.head_dim;
  const int64_t kv_width = int64_t{s.num_kv_heads} * s.head_dim;
  r.q = random_floats(static_cast<size_t>(tokens * q_width), seed);
  std::vector<float> k = random_floats(static_cast<size_t>(tokens * kv_width), seed + 1);
  std::vector<float> v = random_floats(k.size(), seed + 2);
  std::vector<float> ones(static_cast<size_t>(s.head_dim), 1.0f);
  const QkNormRopeParams params{{ones.data(), DType::kF32, s.head_dim},
                                {ones.data(), DType::kF32, s.head_dim},
                                1e-6f,
                                10000.0,
                                s.num_heads,
                                s.num_kv_heads,
                                s.head_dim};
  EXPECT_TRUE(
      backend
          .qk_norm_rope_kv_write(MatrixView::dense(r.q.data(), DType::kF32, tokens, q_width),
                                 MatrixView::dense(k.data(), DType::kF32, tokens, kv_width),
                                 MatrixView::dense(v.data(), DType::kF32, tokens, kv_width), params,
                                 prompts.view, cache, kLayer)
          .ok());
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  r.out.assign(r.q.size(), std::nanf(""));
  EXPECT_TRUE(backend
                  .paged_attention(MatrixView::dense(r.q.data(), DType::kF32, tokens, q_width),
                                   prompts.view, cache, kLayer, s.num_heads, scale,
                                   MatrixView::dense(r.out.data(), DType::kF32, tokens, q_width))
                  .ok());
  Batch decode = last_tokens(prompts);
  std::vector<float> last_q;
  for (int t : std::vector<int32_t>(prompts.query_start.begin() + 1, prompts.query_start.end())) {
    last_q.insert(last_q.end(), r.q.begin() + (t - 1) * q_width, r.q.begin() + t * q_width);
  }
  const int seqs = decode.view.num_tokens;
  r.decode.assign(last_q.size(), std::nanf(""));
  EXPECT_TRUE(backend
                  .paged_attention(MatrixView::dense(last_q.data(), DType::kF32, seqs, q_width),
                                   decode.view, cache, kLayer, s.num_heads, scale,
                                   MatrixView::dense(r.decode.data(), DType::kF32, seqs, q_width))
                  .ok());
  return r;
}

// Element (slot, kv_head, d) of layer kLayer's K or V as the kernels must read it.
double stored(const KvRun& r, bool value, int64_t slot, int kv_head, int d) {
  const auto index = static_cast<size_t>(kv_element(r.layout, kLayer, slot, kv_head, d));
  const float raw = load_as_float((value ? r.v : r.k).data(), r.layout.dtype, index);
  if (r.layout.dtype != DType::kF8E4M3) return raw;
  return double{raw} * (value ? r.v_scales : r.k_scales)[kLayer];
}

struct Reference {
  std::vector<double> out;
  double largest = 0.0;
};

// Causal attention in double over the pool as stored (dequantized), optionally with q rounded
// to bf16 (the avx512_bf16 level's scores over a bf16 pool).
Reference attention_reference(const KvRun& r, const Shape& s, bool q_bf16) {
  const int64_t q_width = int64_t{s.num_heads} * s.head_dim;
  const int group = s.num_heads / s.num_kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  Reference ref;
  ref.out.resize(r.q.size());
  int token = 0;
  for (const int length : s.lengths) {
    const int first = token;
    for (int t = 0; t < length; ++t, ++token) {
      for (int h = 0; h < s.num_heads; ++h) {
        std::vector<double> p(static_cast<size_t>(t + 1));
        for (int u = 0; u <= t; ++u) {
          double dot = 0.0;
          for (int d = 0; d < s.head_dim; ++d) {
            float qv = r.q[static_cast<size_t>(token * q_width + h * s.head_dim + d)];
            if (q_bf16) qv = bf16_to_float(float_to_bf16(qv));
            dot += qv * stored(r, false, r.slots[static_cast<size_t>(first + u)], h / group, d);
          }
          p[static_cast<size_t>(u)] = dot * scale;
        }
        const double top = *std::max_element(p.begin(), p.end());
        double total = 0.0;
        for (double& x : p) total += (x = std::exp(x - top));
        for (int d = 0; d < s.head_dim; ++d) {
          double acc = 0.0;
          for (int u = 0; u <= t; ++u) {
            acc += p[static_cast<size_t>(u)] *
                   stored(r, true, r.slots[static_cast<size_t>(first + u)], h / group, d);
          }
          const double value = acc / total;
          ref.out[static_cast<size_t>(token * q_width + h * s.head_dim + d)] = value;
          ref.largest = std::max(ref.largest, std::fabs(value));
        }
      }
    }
  }
  return ref;
}

std::vector<Shape> shapes() {
  return {
      // The Qwen3 head shape (the AVX-512 tile kernel; decode tiles accumulate directly).
      {16, 8, 128, 16, {45, 33}},
      // Eight heads per KV head, 64-dim heads, a block size that is not a multiple of 16.
      {8, 1, 64, 24, {50}},
      // Head sizes without a vector instance: 16 (avx2 and portable) and 96 (attend<0>).
      {4, 2, 16, 4, {9, 6}},
      {2, 1, 96, 16, {21}},
  };
}

std::string describe(const Shape& s) {
  return "head_dim " + std::to_string(s.head_dim) + " heads " + std::to_string(s.num_heads) + "/" +
         std::to_string(s.num_kv_heads) + " block " + std::to_string(s.block_size);
}

class Fp8Kv : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override { backend_ = make_cpu_backend(2, GetParam()).value(); }
  std::unique_ptr<Backend> backend_;
};

// The write stores float_to_fp8_e4m3_saturated(x / scale) of exactly the rotated K and the V
// that a float32 pool holds: nothing NaN, the V beyond 448 * v_scale clipped to +-448.
TEST_P(Fp8Kv, CacheWriteStoresSaturatedCodesOfTheLayersScale) {
  for (const Shape& s : shapes()) {
    SCOPED_TRACE(describe(s));
    const KvRun exact = run(*backend_, s, DType::kF32, 7);
    const KvRun fp8 = run(*backend_, s, DType::kF8E4M3, 7);
    int saturated = 0;
    for (const int64_t slot : std::vector<int64_t>(fp8.slots.begin(), fp8.slots.end())) {
      for (int h = 0; h < s.num_kv_heads; ++h) {
        for (int d = 0; d < s.head_dim; ++d) {
          const auto index = static_cast<size_t>(kv_element(fp8.layout, kLayer, slot, h, d));
          const auto k_code = static_cast<uint8_t>(fp8.k[index]);
          const auto v_code = static_cast<uint8_t>(fp8.v[index]);
          const float k = reinterpret_cast<const float*>(exact.k.data())[index];
          const float v = reinterpret_cast<const float*>(exact.v.data())[index];
          ASSERT_EQ(k_code, float_to_fp8_e4m3_saturated(k / kKScales[kLayer])) << "K " << index;
          ASSERT_EQ(v_code, float_to_fp8_e4m3_saturated(v / kVScales[kLayer])) << "V " << index;
          ASSERT_FALSE(std::isnan(fp8_e4m3_to_float(v_code)));
          saturated += (v_code & 0x7f) == 0x7e && std::fabs(v / kVScales[kLayer]) > kFp8E4M3Max;
        }
      }
    }
    EXPECT_GT(saturated, 0) << "the test's scale makes some V values saturate";
    // Layer 0 was not written.
    const KvLayout& layout = fp8.layout;
    EXPECT_TRUE(std::all_of(fp8.k.begin(), fp8.k.begin() + layout.layer_elements(),
                            [](std::byte b) { return b == std::byte{0}; }));
  }
}

TEST_P(Fp8Kv, AttentionMatchesFloat64AttentionOverTheDequantizedCache) {
  for (const Shape& s : shapes()) {
    SCOPED_TRACE(describe(s));
    const KvRun fp8 = run(*backend_, s, DType::kF8E4M3, 11);
    const Reference ref = attention_reference(fp8, s, false);
    const double tolerance = 1e-5 * std::max(1.0, ref.largest);
    for (size_t i = 0; i < fp8.out.size(); ++i) {
      ASSERT_NEAR(fp8.out[i], ref.out[i], tolerance) << "element " << i;
    }
    // A sequence's last token decoded alone is bitwise the prefill's result.
    const int64_t q_width = int64_t{s.num_heads} * s.head_dim;
    int last = 0;
    for (size_t seq = 0; seq < s.lengths.size(); ++seq) {
      last += s.lengths[seq];
      for (int64_t e = 0; e < q_width; ++e) {
        ASSERT_EQ(fp8.decode[static_cast<size_t>(static_cast<int64_t>(seq) * q_width + e)],
                  fp8.out[static_cast<size_t>((last - 1) * q_width + e)])
            << "sequence " << seq << " element " << e;
      }
    }
  }
}

// |out_fp8 - out_bf16| <= max |v_fp8 - v_bf16| + max |v_fp8| * (exp(2 ds) - 1) + the kernels'
// own error, ds the largest difference of a score between the two caches: the first term bounds
// the change of the values under fixed weights, the second the change of the softmax weights
// (each moves by a factor within exp(+-2 ds)). Both are measured from the two pools here.
TEST_P(Fp8Kv, AttentionStaysWithinTheQuantizationBoundOfTheBf16Result) {
  for (const Shape& s : shapes()) {
    SCOPED_TRACE(describe(s));
    const KvRun fp8 =
        run(*backend_, s, DType::kF8E4M3, 13, kUnsaturatedKScales, kUnsaturatedVScales);
    const KvRun bf16 = run(*backend_, s, DType::kBF16, 13);
    const bool q_bf16 = GetParam() == CpuIsa::kAvx512Bf16 && s.head_dim % 32 == 0;
    const int64_t q_width = int64_t{s.num_heads} * s.head_dim;
    const int group = s.num_heads / s.num_kv_heads;
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
    double value_error = 0.0;
    double largest_value = 0.0;
    double score_error = 0.0;
    for (size_t i = 0; i < fp8.slots.size(); ++i) {
      for (int h = 0; h < s.num_kv_heads; ++h) {
        for (int d = 0; d < s.head_dim; ++d) {
          const double v8 = stored(fp8, true, fp8.slots[i], h, d);
          value_error =
              std::max(value_error, std::fabs(v8 - stored(bf16, true, fp8.slots[i], h, d)));
          largest_value = std::max(largest_value, std::fabs(v8));
        }
      }
    }
    for (size_t t = 0; t < fp8.slots.size(); ++t) {
      for (int h = 0; h < s.num_heads; ++h) {
        for (size_t u = 0; u < fp8.slots.size(); ++u) {
          double difference = 0.0;
          for (int d = 0; d < s.head_dim; ++d) {
            float qv =
                fp8.q[t * static_cast<size_t>(q_width) + static_cast<size_t>(h * s.head_dim + d)];
            const double k8 = stored(fp8, false, fp8.slots[u], h / group, d);
            const double k16 = stored(bf16, false, fp8.slots[u], h / group, d);
            difference += qv * k8;
            if (q_bf16) qv = bf16_to_float(float_to_bf16(qv));
            difference -= qv * k16;
          }
          score_error = std::max(score_error, std::fabs(difference) * scale);
        }
      }
    }
    const double bound = value_error + largest_value * std::expm1(2.0 * score_error) +
                         2e-5 * std::max(1.0, largest_value);
    double worst = 0.0;
    for (size_t i = 0; i < fp8.out.size(); ++i) {
      worst = std::max(worst, std::fabs(double{fp8.out[i]} - bf16.out[i]));
    }
    EXPECT_LE(worst, bound) << "value error " << value_error << ", score error " << score_error;
    std::printf("  %s: fp8 vs bf16 KV max |difference| %.3g, bound %.3g (largest value %.3g)\n",
                describe(s).c_str(), worst, bound, largest_value);
    // And the quantization shows: an FP8 cache that read back bf16 values would be a bug.
    EXPECT_GT(worst, 0.0);
  }
}

// One key per sequence: the softmax weight is exactly 1, so the output is the stored V times
// v_scale (a power of two here): every code, including the subnormals and NaN, read exactly.
TEST_P(Fp8Kv, EveryCodeIsReadExactly) {
  for (const int head_dim : {128, 16}) {
    SCOPED_TRACE("head_dim " + std::to_string(head_dim));
    const int seqs = 256 / head_dim;
    const KvLayout layout{2, seqs, 16, 1, head_dim, DType::kF8E4M3};
    std::vector<uint8_t> k(layout.total_bytes() / 2, 0);
    std::vector<uint8_t> v(layout.total_bytes() / 2, 0);
    for (int code = 0; code < 256; ++code) {
      const int seq = code / head_dim;
      v[static_cast<size_t>(kv_element(layout, kLayer, kv_slot(layout, seq, 0), 0,
                                       code % head_dim))] = static_cast<uint8_t>(code);
    }
    const std::vector<float> k_scales = {1.0f, 3.0f};
    const std::vector<float> v_scales = {1.0f, 0.5f};
    const KvCacheView cache{k.data(), v.data(), layout, k_scales.data(), v_scales.data()};
    std::vector<int32_t> query_start, context(static_cast<size_t>(seqs), 1), tables,
        positions(static_cast<size_t>(seqs), 0), slots;
    for (int s = 0; s <= seqs; ++s) query_start.push_back(s);
    for (int s = 0; s < seqs; ++s) {
      tables.push_back(s);
      slots.push_back(s * 16);
    }
    AttentionBatch batch;
    batch.num_seqs = batch.num_tokens = seqs;
    batch.max_blocks_per_seq = batch.max_query_len = batch.max_context_len = 1;
    batch.query_start = query_start.data();
    batch.context_lens = context.data();
    batch.block_tables = tables.data();
    batch.positions = positions.data();
    batch.slot_mapping = slots.data();
    std::vector<float> q = random_floats(static_cast<size_t>(seqs * head_dim), 3);
    std::vector<float> out(q.size(), 0.0f);
    ASSERT_TRUE(backend_
                    ->paged_attention(MatrixView::dense(q.data(), DType::kF32, seqs, head_dim),
                                      batch, cache, kLayer, 1, 0.1f,
                                      MatrixView::dense(out.data(), DType::kF32, seqs, head_dim))
                    .ok());
    for (int code = 0; code < 256; ++code) {
      const float expected = fp8_e4m3_to_float(static_cast<uint8_t>(code)) * 0.5f;
      if (std::isnan(expected)) {
        EXPECT_TRUE(std::isnan(out[static_cast<size_t>(code)])) << "code " << code;
      } else {
        EXPECT_EQ(out[static_cast<size_t>(code)], expected) << "code " << code;
      }
    }
  }
}

std::string level_name(const ::testing::TestParamInfo<CpuIsa>& info) {
  return std::string(cpu_isa_name(info.param));
}

INSTANTIATE_TEST_SUITE_P(Levels, Fp8Kv, ::testing::ValuesIn(supported_cpu_isas()), level_name);

TEST(KvCacheDtype, TakesVllmsFp8NamesAndRefusesE5m2) {
  for (const char* name : {"fp8", "fp8_e4m3"}) {
    Result<std::optional<DType>> dtype = parse_kv_cache_dtype(name);
    ASSERT_TRUE(dtype.ok()) << name;
    EXPECT_EQ(dtype->value(), DType::kF8E4M3) << name;
  }
  Result<std::optional<DType>> e5m2 = parse_kv_cache_dtype("fp8_e5m2");
  ASSERT_FALSE(e5m2.ok());
  EXPECT_EQ(e5m2.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e5m2.status().message().find("fp8_e5m2 is not supported"), std::string::npos);
  EXPECT_FALSE(parse_kv_cache_dtype("float8_e4m3fn").ok());
  EXPECT_FALSE(parse_kv_cache_dtype("float16").ok());
}

// One-byte elements: the same memory holds twice the blocks of a bf16 pool.
TEST(KvCacheDtype, AnFp8PoolHoldsTwiceTheBlocksOfABf16One) {
  ModelConfig config;
  config.num_hidden_layers = 28;
  config.num_key_value_heads = 8;
  config.head_dim = 128;
  const size_t bytes = size_t{1} << 30;
  const int bf16 = kv_blocks_for_memory(config, bytes, 16, DType::kBF16);
  const int fp8 = kv_blocks_for_memory(config, bytes, 16, DType::kF8E4M3);
  EXPECT_EQ(bf16, static_cast<int>(bytes / (2 * 28 * 16 * 8 * 128 * 2)));
  EXPECT_EQ(fp8, 2 * bf16);
}

TEST(KvCacheDtype, ScalesAreCheckedAtCreation) {
  std::unique_ptr<Backend> backend = make_cpu_backend(1, supported_cpu_isas().front()).value();
  const KvLayout fp8{2, 4, 16, 1, 16, DType::kF8E4M3};
  Result<KvCache> unit = KvCache::create(*backend, fp8);
  ASSERT_TRUE(unit.ok());
  EXPECT_EQ(unit->view().k_scale(1), 1.0f);
  Result<KvCache> scaled = KvCache::create(*backend, fp8, {{0.5f, 2.0f}, {1.0f, 4.0f}});
  ASSERT_TRUE(scaled.ok());
  EXPECT_EQ(scaled->view().k_scale(1), 2.0f);
  EXPECT_EQ(scaled->view().v_scale(1), 4.0f);
  EXPECT_FALSE(KvCache::create(*backend, fp8, {{1.0f}, {1.0f}}).ok()) << "one per layer";
  EXPECT_FALSE(KvCache::create(*backend, fp8, {{1.0f, 0.0f}, {1.0f, 1.0f}}).ok());
  EXPECT_FALSE(KvCache::create(*backend, fp8, {{1.0f, std::nanf("")}, {1.0f, 1.0f}}).ok());
  const KvLayout bf16{2, 4, 16, 1, 16, DType::kBF16};
  EXPECT_FALSE(KvCache::create(*backend, bf16, {{1.0f, 1.0f}, {1.0f, 1.0f}}).ok());
}

}  // namespace
}  // namespace pdserve
