// Every CUDA backend operation against the CPU backend (the reference) on fresh random inputs
// of several shapes; CUDA outputs are poisoned with NaN first, so an element a kernel forgets
// to write fails. Then a whole synthetic model: CUDA (bf16) logits and greedy tokens against
// the CPU in float32. Without a CUDA device the binary prints "SKIPPED: no CUDA device" and
// exits with 77, which CTest reports as skipped (label gpu only; gpu_test_main.h).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/core/dtype.h"
#include "common/model/checkpoint.h"
#include "common/model/qwen3_weights.h"
#include "common/model/synthetic_checkpoint.h"
#include "kernels/backend.h"
#include "kernels/cuda_device.h"
#include "kernels/model/kv_cache.h"
#ifdef PDSERVE_WITH_CUDA
#include "kernels/model/gpu_graph_runner.h"
#endif
#include "kernels/model/qwen3_model.h"
#include "tests/kernels_gpu/gpu_test_main.h"

namespace pdserve {
namespace {

using gpu_test::DeviceMatrix;

constexpr double kRelTol = 1e-2;

std::vector<float> random_floats(size_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> values(count);
  for (float& v : values) v = dist(rng);
  return values;
}

// Rounds through bf16 so both backends start from identical values.
std::vector<float> bf16_rounded(std::vector<float> values) {
  for (float& v : values) v = bf16_to_float(float_to_bf16(v));
  return values;
}

// |actual - expected| <= tol * max(1, max |expected|), and no element left unwritten.
void expect_close(const std::vector<float>& actual, const std::vector<float>& expected,
                  const std::string& what, double rel_tol = kRelTol) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double scale = 1.0;
  for (float e : expected) scale = std::max(scale, static_cast<double>(std::fabs(e)));
  double worst = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_FALSE(std::isnan(actual[i])) << what << ": element " << i << " not written";
    worst = std::max(worst, std::fabs(static_cast<double>(actual[i]) - expected[i]));
    ASSERT_LE(std::fabs(static_cast<double>(actual[i]) - expected[i]), rel_tol * scale)
        << what << " element " << i << ": " << actual[i] << " vs " << expected[i];
  }
  std::printf("  %-60s max abs error %.3g (scale %.3g)\n", what.c_str(), worst, scale);
}

class CudaVsCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    BackendOptions cuda_options;
    cuda_options.device = DeviceKind::kCuda;
    cuda_ = std::move(create_backend(cuda_options)).value();
    cpu_ = std::move(create_backend(BackendOptions{})).value();
    EXPECT_EQ(cuda_->activation_dtype(), DType::kBF16);
  }
  MatrixView host(std::vector<float>& values, int64_t rows, int64_t cols) {
    return MatrixView::dense(values.data(), DType::kF32, rows, cols);
  }
  DeviceMatrix device(const std::vector<float>& values, int64_t rows, int64_t cols,
                      DType dtype = DType::kBF16) {
    return DeviceMatrix(*cuda_, values, dtype, rows, cols);
  }
  DeviceBuffer device_ints(const std::vector<int32_t>& values) {
    DeviceBuffer buffer = std::move(cuda_->allocate(values.size() * 4)).value();
    EXPECT_TRUE(cuda_->copy_to_device(buffer.data(), values.data(), values.size() * 4).ok());
    return buffer;
  }

  std::unique_ptr<Backend> cuda_;
  std::unique_ptr<Backend> cpu_;
};

TEST_F(CudaVsCpu, LinearBf16InFloatAccumulation) {
  struct Shape {
    int64_t m, n, k;
  };
  for (DType out_dtype : {DType::kBF16, DType::kF32}) {
    for (Shape s : {Shape{1, 1, 8}, Shape{1, 97, 64}, Shape{5, 50, 16}, Shape{7, 130, 1024},
                    Shape{33, 49, 200}, Shape{256, 512, 1024}}) {
      std::vector<float> x = bf16_rounded(random_floats(static_cast<size_t>(s.m * s.k), 1));
      std::vector<float> w = bf16_rounded(random_floats(static_cast<size_t>(s.n * s.k), 2, 0.5f));
      std::vector<float> expected(static_cast<size_t>(s.m * s.n));
      ASSERT_TRUE(
          cpu_->linear(host(x, s.m, s.k), host(w, s.n, s.k), host(expected, s.m, s.n)).ok());
      DeviceMatrix dx = device(x, s.m, s.k), dw = device(w, s.n, s.k);
      DeviceMatrix dy = DeviceMatrix::poisoned(*cuda_, out_dtype, s.m, s.n);
      ASSERT_TRUE(cuda_->linear(dx.view(), dw.view(), dy.view()).ok());
      ASSERT_TRUE(cuda_->synchronize().ok());
      expect_close(dy.download(), expected,
                   "linear " + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
                       std::to_string(s.k) + " -> " + std::string(dtype_name(out_dtype)));
    }
  }
}

TEST_F(CudaVsCpu, LinearIntoAColumnSliceLeavesTheRestAlone) {
  const int64_t m = 3, k = 64, n = 40, wide = 100;
  std::vector<float> x = bf16_rounded(random_floats(m * k, 3));
  std::vector<float> w = bf16_rounded(random_floats(n * k, 4, 0.5f));
  std::vector<float> expected(m * n);
  ASSERT_TRUE(cpu_->linear(host(x, m, k), host(w, n, k), host(expected, m, n)).ok());
  DeviceMatrix dx = device(x, m, k), dw = device(w, n, k);
  DeviceMatrix dy = DeviceMatrix::poisoned(*cuda_, DType::kBF16, m, wide);
  ASSERT_TRUE(cuda_->linear(dx.view(), dw.view(), dy.view().column_slice(30, n)).ok());
  const std::vector<float> all = dy.download();
  std::vector<float> slice;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < wide; ++c) {
      const float value = all[static_cast<size_t>(r * wide + c)];
      if (c >= 30 && c < 30 + n) {
        slice.push_back(value);
      } else {
        EXPECT_TRUE(std::isnan(value)) << "wrote outside the slice at " << r << "," << c;
      }
    }
  }
  expect_close(slice, expected, "linear into column slice");
}

TEST_F(CudaVsCpu, RmsNormAndFusedResidualAdd) {
  for (int64_t rows : {1, 3, 17}) {
    for (int64_t cols : {64, 1000, 4096}) {
      std::vector<float> in = bf16_rounded(random_floats(rows * cols, 5, 2.0f));
      std::vector<float> weight = bf16_rounded(random_floats(cols, 6, 0.1f));
      for (float& w : weight) w = bf16_to_float(float_to_bf16(w + 1.0f));
      std::vector<float> add = bf16_rounded(random_floats(rows * cols, 7));
      DeviceMatrix dweight = device(weight, 1, cols);
      VectorView cpu_weight{weight.data(), DType::kF32, cols};
      const std::string shape = std::to_string(rows) + "x" + std::to_string(cols);

      std::vector<float> expected(in.size());
      ASSERT_TRUE(
          cpu_->rms_norm(host(in, rows, cols), cpu_weight, 1e-6f, host(expected, rows, cols)).ok());
      DeviceMatrix din = device(in, rows, cols);
      DeviceMatrix dout = DeviceMatrix::poisoned(*cuda_, DType::kBF16, rows, cols);
      ASSERT_TRUE(cuda_->rms_norm(din.view(), dweight.vector(), 1e-6f, dout.view()).ok());
      expect_close(dout.download(), expected, "rms_norm " + shape);

      // add_rms_norm(x = add, residual = in): residual += x; x = norm(residual).
      std::vector<float> x = add, residual = in;
      ASSERT_TRUE(
          cpu_->add_rms_norm(host(x, rows, cols), host(residual, rows, cols), cpu_weight, 1e-6f)
              .ok());
      DeviceMatrix dx = device(add, rows, cols), dresidual = device(in, rows, cols);
      ASSERT_TRUE(cuda_->add_rms_norm(dx.view(), dresidual.view(), dweight.vector(), 1e-6f).ok());
      expect_close(dresidual.download(), residual, "add_rms_norm residual " + shape);
      expect_close(dx.download(), x, "add_rms_norm output " + shape);
    }
  }
}

TEST_F(CudaVsCpu, EmbeddingSiluMulAndGatherRows) {
  const int64_t vocab = 300, width = 96, tokens = 9;
  std::vector<float> table = bf16_rounded(random_floats(vocab * width, 8));
  const std::vector<int32_t> ids = {0, 299, 5, 5, 17, 128, 1, 250, 3};
  std::vector<float> expected(tokens * width);
  ASSERT_TRUE(
      cpu_->embedding(host(table, vocab, width), ids.data(), host(expected, tokens, width)).ok());
  DeviceMatrix dtable = device(table, vocab, width);
  DeviceBuffer dids = device_ints(ids);
  DeviceMatrix dout = DeviceMatrix::poisoned(*cuda_, DType::kBF16, tokens, width);
  ASSERT_TRUE(cuda_->embedding(dtable.view(), dids.as<int32_t>(), dout.view()).ok());
  EXPECT_EQ(dout.download(), expected) << "embedding copies bf16 rows exactly";

  std::vector<float> gate = bf16_rounded(random_floats(tokens * width, 9, 3.0f));
  std::vector<float> up = bf16_rounded(random_floats(tokens * width, 10));
  std::vector<float> act(gate.size());
  ASSERT_TRUE(
      cpu_->silu_mul(host(gate, tokens, width), host(up, tokens, width), host(act, tokens, width))
          .ok());
  DeviceMatrix dgate = device(gate, tokens, width), dup = device(up, tokens, width);
  DeviceMatrix dact = DeviceMatrix::poisoned(*cuda_, DType::kBF16, tokens, width);
  ASSERT_TRUE(cuda_->silu_mul(dgate.view(), dup.view(), dact.view()).ok());
  expect_close(dact.download(), act, "silu_mul");

  const std::vector<int32_t> rows = {8, 0, 4};
  std::vector<float> gathered(rows.size() * width);
  ASSERT_TRUE(
      cpu_->gather_rows(host(expected, tokens, width), rows.data(), host(gathered, 3, width)).ok());
  DeviceBuffer drows = device_ints(rows);
  DeviceMatrix dgathered = DeviceMatrix::poisoned(*cuda_, DType::kBF16, 3, width);
  ASSERT_TRUE(cuda_->gather_rows(dout.view(), drows.as<int32_t>(), dgathered.view()).ok());
  EXPECT_EQ(dgathered.download(), gathered);
  ASSERT_TRUE(cuda_->synchronize().ok());
}

TEST_F(CudaVsCpu, OutOfRangeIdsAreReportedAtSynchronize) {
  std::vector<float> table = random_floats(10 * 32, 11);
  DeviceMatrix dtable = device(table, 10, 32);
  DeviceBuffer dids = device_ints({3, 10});
  DeviceMatrix dout = DeviceMatrix::poisoned(*cuda_, DType::kBF16, 2, 32);
  ASSERT_TRUE(cuda_->embedding(dtable.view(), dids.as<int32_t>(), dout.view()).ok());
  const Status status = cuda_->synchronize();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("token id"), std::string::npos) << status.to_string();
  EXPECT_TRUE(cuda_->synchronize().ok()) << "the error is reported once";
}

// A paged-attention scenario: sequences with their new-token counts and cached lengths,
// blocks scattered through the pool.
struct Scenario {
  std::string name;
  int num_heads, num_kv_heads, head_dim, block_size;
  std::vector<int> query_lens, context_lens;
};

struct PagedBatch {
  std::vector<int32_t> query_start, context_lens, block_tables, positions, slot_mapping;
  int num_blocks = 0, max_blocks = 0, tokens = 0, max_query = 0, max_context = 0;
};

PagedBatch make_batch(const Scenario& s, uint32_t seed) {
  PagedBatch b;
  b.query_start.push_back(0);
  for (size_t i = 0; i < s.query_lens.size(); ++i) {
    b.max_blocks = std::max(b.max_blocks, (s.context_lens[i] + s.block_size - 1) / s.block_size);
    b.max_query = std::max(b.max_query, s.query_lens[i]);
    b.max_context = std::max(b.max_context, s.context_lens[i]);
  }
  b.num_blocks = b.max_blocks * static_cast<int>(s.query_lens.size()) + 3;
  std::vector<int32_t> free_blocks(static_cast<size_t>(b.num_blocks));
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), std::mt19937(seed));
  size_t next = 0;
  for (size_t i = 0; i < s.query_lens.size(); ++i) {
    std::vector<int32_t> table(static_cast<size_t>(b.max_blocks), 0);
    const int blocks = (s.context_lens[i] + s.block_size - 1) / s.block_size;
    for (int j = 0; j < blocks; ++j) table[static_cast<size_t>(j)] = free_blocks[next++];
    b.block_tables.insert(b.block_tables.end(), table.begin(), table.end());
    for (int t = 0; t < s.query_lens[i]; ++t) {
      const int position = s.context_lens[i] - s.query_lens[i] + t;
      b.positions.push_back(position);
      b.slot_mapping.push_back(table[static_cast<size_t>(position / s.block_size)] * s.block_size +
                               position % s.block_size);
    }
    b.query_start.push_back(b.query_start.back() + s.query_lens[i]);
    b.context_lens.push_back(s.context_lens[i]);
  }
  b.tokens = b.query_start.back();
  return b;
}

AttentionBatch host_view(PagedBatch& b, int num_seqs) {
  return {num_seqs,
          b.tokens,
          b.max_blocks,
          b.max_query,
          b.max_context,
          b.query_start.data(),
          b.context_lens.data(),
          b.block_tables.data(),
          b.positions.data(),
          b.slot_mapping.data()};
}

class CudaPagedAttention : public CudaVsCpu, public ::testing::WithParamInterface<Scenario> {};

// qk_norm_rope_kv_write then paged_attention on both backends, from the same random pool
// (bf16-rounded) and the same new q/k/v; compares q, k after RoPE, the pool and the output.
TEST_P(CudaPagedAttention, NormRopeKvWriteAndAttentionMatchTheCpu) {
  const Scenario& s = GetParam();
  PagedBatch b = make_batch(s, 21);
  const int num_seqs = static_cast<int>(s.query_lens.size());
  const int64_t q_width = int64_t{s.num_heads} * s.head_dim;
  const int64_t kv_width = int64_t{s.num_kv_heads} * s.head_dim;
  const int num_layers = 2;
  const int layer = 1;
  for (DType kv_dtype : {DType::kBF16, DType::kF32}) {
    const size_t pool = static_cast<size_t>(num_layers) * b.num_blocks * s.block_size * kv_width;
    std::vector<float> k_pool = bf16_rounded(random_floats(pool, 22));
    std::vector<float> v_pool = bf16_rounded(random_floats(pool, 23));
    std::vector<float> q = bf16_rounded(random_floats(b.tokens * q_width, 24, 2.0f));
    std::vector<float> k = bf16_rounded(random_floats(b.tokens * kv_width, 25, 2.0f));
    std::vector<float> v = bf16_rounded(random_floats(b.tokens * kv_width, 26));
    std::vector<float> q_norm = bf16_rounded(random_floats(s.head_dim, 27, 0.1f));
    std::vector<float> k_norm = bf16_rounded(random_floats(s.head_dim, 28, 0.1f));
    for (float& w : q_norm) w = bf16_to_float(float_to_bf16(w + 1.0f));
    for (float& w : k_norm) w = bf16_to_float(float_to_bf16(w + 1.0f));
    QkNormRopeParams rope;
    rope.rms_norm_eps = 1e-6f;
    rope.rope_theta = 1000000.0;
    rope.num_heads = s.num_heads;
    rope.num_kv_heads = s.num_kv_heads;
    rope.head_dim = s.head_dim;
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));

    // CPU reference (float32 pool holding the bf16 values).
    std::vector<float> cpu_k_pool = k_pool, cpu_v_pool = v_pool, cpu_q = q, cpu_k = k, cpu_v = v;
    KvCacheView cpu_cache{
        cpu_k_pool.data(), cpu_v_pool.data(),
        KvLayout{num_layers, b.num_blocks, s.block_size, s.num_kv_heads, s.head_dim, DType::kF32}};
    rope.q_norm_weight = {q_norm.data(), DType::kF32, s.head_dim};
    rope.k_norm_weight = {k_norm.data(), DType::kF32, s.head_dim};
    const AttentionBatch cpu_batch = host_view(b, num_seqs);
    ASSERT_TRUE(cpu_->qk_norm_rope_kv_write(
                        host(cpu_q, b.tokens, q_width), host(cpu_k, b.tokens, kv_width),
                        host(cpu_v, b.tokens, kv_width), rope, cpu_batch, cpu_cache, layer)
                    .ok());
    std::vector<float> expected(cpu_q.size());
    ASSERT_TRUE(cpu_->paged_attention(host(cpu_q, b.tokens, q_width), cpu_batch, cpu_cache, layer,
                                      s.num_heads, scale, host(expected, b.tokens, q_width))
                    .ok());

    // CUDA.
    DeviceMatrix dk_pool = device(k_pool, 1, static_cast<int64_t>(pool), kv_dtype);
    DeviceMatrix dv_pool = device(v_pool, 1, static_cast<int64_t>(pool), kv_dtype);
    DeviceMatrix dq = device(q, b.tokens, q_width), dk = device(k, b.tokens, kv_width),
                 dv = device(v, b.tokens, kv_width);
    DeviceMatrix dq_norm = device(q_norm, 1, s.head_dim), dk_norm = device(k_norm, 1, s.head_dim);
    DeviceBuffer query_start = device_ints(b.query_start), context = device_ints(b.context_lens),
                 tables = device_ints(b.block_tables), positions = device_ints(b.positions),
                 slots = device_ints(b.slot_mapping);
    AttentionBatch batch = cpu_batch;
    batch.query_start = query_start.as<int32_t>();
    batch.context_lens = context.as<int32_t>();
    batch.block_tables = tables.as<int32_t>();
    batch.positions = positions.as<int32_t>();
    batch.slot_mapping = slots.as<int32_t>();
    KvCacheView cache = cpu_cache;
    cache.k = dk_pool.data();
    cache.v = dv_pool.data();
    cache.layout.dtype = kv_dtype;
    rope.q_norm_weight = dq_norm.vector();
    rope.k_norm_weight = dk_norm.vector();
    ASSERT_TRUE(
        cuda_->qk_norm_rope_kv_write(dq.view(), dk.view(), dv.view(), rope, batch, cache, layer)
            .ok());
    DeviceMatrix dout = DeviceMatrix::poisoned(*cuda_, DType::kBF16, b.tokens, q_width);
    ASSERT_TRUE(
        cuda_->paged_attention(dq.view(), batch, cache, layer, s.num_heads, scale, dout.view())
            .ok());
    ASSERT_TRUE(cuda_->synchronize().ok());
    const std::string what = s.name + " kv " + std::string(dtype_name(kv_dtype));
    expect_close(dq.download(), cpu_q, what + " q after norm+rope");
    expect_close(dk.download(), cpu_k, what + " k after norm+rope");
    expect_close(dk_pool.download(), cpu_k_pool, what + " K pool");
    expect_close(dv_pool.download(), cpu_v_pool, what + " V pool");
    expect_close(dout.download(), expected, what + " attention");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaPagedAttention,
    ::testing::Values(
        Scenario{"decode_gqa2_splitk", 16, 8, 128, 16, {1, 1, 1, 1, 1}, {1, 17, 300, 1000, 4097}},
        Scenario{"decode_gqa4_one_seq_long", 32, 8, 128, 16, {1}, {8191}},
        Scenario{"decode_mha_hd64", 4, 4, 64, 32, {1, 1}, {33, 64}},
        Scenario{"prefill_whole_prompts", 8, 2, 64, 16, {70, 5, 1}, {70, 5, 1}},
        Scenario{"prefill_chunks_over_cache", 16, 8, 128, 16, {37, 64, 1}, {100, 64, 2000}},
        Scenario{"prefill_gqa16_hd256", 16, 1, 256, 8, {20}, {45}}),
    [](const ::testing::TestParamInfo<Scenario>& param_info) { return param_info.param.name; });

// A whole synthetic Qwen3 (2 layers of the 0.6B shape, and the head_dim-64 GQA-4 shape):
// prompt prefill then 24 greedy decode steps, teacher-forced with the CPU's tokens. The CUDA
// logits stay within 2% of the logit scale and pick the same token wherever the CPU's top-2
// margin exceeds that error.
class CudaModel : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaModel, GreedyTokensMatchTheCpuInFloat32) {
  const std::filesystem::path dir = gpu_test::write_test_model(GetParam(), "cuda-model", 2, 5);
  Checkpoint checkpoint = Checkpoint::open(dir).value();

  BackendOptions cuda_options;
  cuda_options.device = DeviceKind::kCuda;
  std::unique_ptr<Backend> cuda = std::move(create_backend(cuda_options)).value();
  std::unique_ptr<Backend> cpu = std::move(create_backend(BackendOptions{})).value();
  ForwardLimits limits;
  limits.max_num_tokens = 256;
  limits.max_num_seqs = 4;
  limits.max_model_len = 512;
  gpu_test::PlacedModel on_cuda =
      gpu_test::place_model(*cuda, checkpoint, DType::kBF16, DType::kBF16, limits, 40, 16);
  gpu_test::PlacedModel on_cpu =
      gpu_test::place_model(*cpu, checkpoint, DType::kF32, DType::kF32, limits, 40, 16);
  const ModelConfig& config = on_cpu.model->config();

  std::vector<int32_t> table(32);
  std::iota(table.begin(), table.end(), 3);
  std::vector<int32_t> prompt(200);
  std::mt19937 rng(9);
  for (int32_t& id : prompt) id = static_cast<int32_t>(rng() % config.vocab_size);
  const size_t vocab = static_cast<size_t>(config.vocab_size);
  std::vector<float> cuda_logits(vocab), cpu_logits(vocab);
  std::vector<int32_t> input = prompt;
  int cached = 0;
  int agreed = 0;
  for (int step = 0; step <= 24; ++step) {
    const SequenceSlice slice{input, cached, table};
    ASSERT_TRUE(on_cpu.model->forward({&slice, 1}, on_cpu.cache, on_cpu.context, cpu_logits).ok());
    const Status status =
        on_cuda.model->forward({&slice, 1}, on_cuda.cache, on_cuda.context, cuda_logits);
    ASSERT_TRUE(status.ok()) << status.to_string();
    expect_close(cuda_logits, cpu_logits, "step " + std::to_string(step) + " logits", 2e-2);
    std::vector<size_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                      [&](size_t a, size_t b) { return cpu_logits[a] > cpu_logits[b]; });
    const size_t cuda_top = static_cast<size_t>(
        std::max_element(cuda_logits.begin(), cuda_logits.end()) - cuda_logits.begin());
    double scale = 1.0;
    for (float l : cpu_logits) scale = std::max(scale, static_cast<double>(std::fabs(l)));
    if (cpu_logits[order[0]] - cpu_logits[order[1]] > 4e-2 * scale) {
      EXPECT_EQ(cuda_top, order[0]) << "step " << step;
      ++agreed;
    }
    cached += static_cast<int>(input.size());
    input = {static_cast<int32_t>(order[0])};
  }
  std::printf("  greedy tokens compared with a clear margin: %d of 25\n", agreed);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Configs, CudaModel,
                         ::testing::Values("configs/models/qwen3-0.6b/config.json",
                                           "tests/data/reference/configs/hd64_gqa4.json"));

#ifdef PDSERVE_WITH_CUDA
// Decode steps replayed from CUDA graphs (3 sequences padded to the bucket of 4) give the
// logits of eager steps, and a prefill step falls back to the eager path.
TEST(CudaDecodeGraphs, ReplayedStepsMatchEagerSteps) {
  const std::filesystem::path dir = gpu_test::write_test_model(
      "tests/data/reference/configs/hd64_gqa4.json", "cuda-graphs", 2, 0);
  Checkpoint checkpoint = Checkpoint::open(dir).value();
  BackendOptions cuda_options;
  cuda_options.device = DeviceKind::kCuda;
  std::unique_ptr<Backend> cuda = std::move(create_backend(cuda_options)).value();
  std::unique_ptr<Qwen3Model> model =
      std::move(Qwen3Model::create(*cuda, load_qwen3_weights(checkpoint, DType::kBF16).value()))
          .value();
  const ModelConfig& config = model->config();
  ForwardLimits limits;
  limits.max_num_tokens = 128;
  limits.max_num_seqs = 8;
  limits.max_model_len = 256;
  constexpr int kBlockSize = 16;
  constexpr int kBlocks = 64;
  ForwardContext eager_context = ForwardContext::create(*cuda, config, limits, kBlockSize).value();
  ForwardContext graph_context = ForwardContext::create(*cuda, config, limits, kBlockSize).value();
  KvCache eager_cache =
      KvCache::create(*cuda, kv_layout_for(config, kBlocks, kBlockSize, DType::kBF16)).value();
  KvCache graph_cache =
      KvCache::create(*cuda, kv_layout_for(config, kBlocks, kBlockSize, DType::kBF16)).value();
  std::unique_ptr<DecodeGraphRunner> runner =
      std::move(DecodeGraphRunner::create(*cuda, *model, graph_cache, graph_context, kBlocks - 1))
          .value();
  EXPECT_EQ(runner->num_graphs(), 4);  // 1, 2, 4, 8

  std::vector<std::vector<int32_t>> tables(3, std::vector<int32_t>(16));
  for (int s = 0; s < 3; ++s) std::iota(tables[s].begin(), tables[s].end(), s * 16);
  std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5}, {9, 8, 7}, {100, 200, 300, 400}};
  const size_t vocab = static_cast<size_t>(config.vocab_size);
  std::vector<float> eager(3 * vocab), graph(3 * vocab);
  std::vector<SequenceSlice> prefill;
  for (int s = 0; s < 3; ++s) prefill.push_back({prompts[s], 0, tables[s]});
  ASSERT_TRUE(model->forward(prefill, eager_cache, eager_context, eager).ok());
  ASSERT_TRUE(runner->forward(prefill, graph).ok());  // not decode-only: eager inside
  expect_close(graph, eager, "prefill through the runner");
  std::vector<int> cached = {5, 3, 4};
  gpu_test::decode_eager_and_replayed(
      *model, eager_cache, eager_context, *runner, tables, cached, 5, eager, graph, [&](int step) {
        expect_close(graph, eager, "decode step " + std::to_string(step) + " replayed vs eager");
      });
  std::filesystem::remove_all(dir);
}
#endif

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  return pdserve::gpu_test::run_main(argc, argv, pdserve::gpu_test::CpuStandIn::kNever);
}
