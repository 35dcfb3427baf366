// Every backend operation against a straightforward double-precision reference written here,
// on random inputs of several shapes (the llama.cpp test-backend-ops idea). Outputs are
// poisoned with NaN first so an element the kernel forgets to write fails the comparison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/core/dtype.h"
#include "kernels/backend.h"
#include "kernels/cpu_backend.h"
#include "kernels/linear_cpu.h"
#include "kernels/model/model_loader.h"
#include "kernels/vector_math.h"

namespace pdserve {
namespace {

constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();

std::vector<float> random_floats(size_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> values(count);
  for (float& v : values) v = dist(rng);
  return values;
}

// Weights stored in `dtype`, with the float values they represent exactly.
struct TypedWeights {
  std::vector<std::byte> bytes;
  std::vector<float> values;
};

TypedWeights make_weights(size_t count, DType dtype, uint32_t seed) {
  TypedWeights w;
  std::vector<float> raw = random_floats(count, seed, 0.5f);
  w.bytes.resize(count * dtype_size(dtype));
  convert_elements(raw.data(), DType::kF32, w.bytes.data(), dtype, count);
  w.values.resize(count);
  convert_elements(w.bytes.data(), dtype, w.values.data(), DType::kF32, count);
  return w;
}

void expect_close(const std::vector<float>& actual, const std::vector<double>& expected,
                  double rel_tol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size());
  double scale = 0.0;
  for (double e : expected) scale = std::max(scale, std::fabs(e));
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_FALSE(std::isnan(actual[i])) << what << ": element " << i << " not written";
    ASSERT_NEAR(actual[i], expected[i], rel_tol * std::max(1.0, scale)) << what << " element " << i;
  }
}

// The avx512_bf16 level rounds a linear layer's activations (bf16 weights) and the attention's
// queries (bf16 KV) to bf16 before multiplying: its references round the same inputs, so the
// comparison stays as tight as for the float32 levels.
bool rounds_to_bf16(CpuIsa isa, DType operand) {
  return isa == CpuIsa::kAvx512Bf16 && operand == DType::kBF16;
}

float round_bf16(float value) {
  return bf16_to_float(float_to_bf16(value));
}

std::string level_name(const ::testing::TestParamInfo<CpuIsa>& info) {
  return std::string(cpu_isa_name(info.param));
}

// Every test runs at every instruction-set level this CPU has (kernels/cpu_isa.h).
class BackendOps : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    BackendOptions options;
    options.device = DeviceKind::kCpu;
    options.cpu_isa = GetParam();
    backend_ = std::move(create_backend(options)).value();
    ASSERT_EQ(cpu_backend_isa(*backend_), GetParam());
  }
  std::unique_ptr<Backend> backend_;
};

TEST_P(BackendOps, LinearMatchesDoubleReferenceForEveryWeightType) {
  struct Shape { int64_t m, n, k; };
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    const bool rounded = rounds_to_bf16(GetParam(), dtype);
    for (Shape s : {Shape{1, 1, 8}, Shape{1, 97, 64}, Shape{5, 50, 13}, Shape{7, 130, 1024},
                    Shape{33, 49, 200}, Shape{2, 7, 4100}, Shape{6, 390, 48}}) {
      std::vector<float> x = random_floats(static_cast<size_t>(s.m * s.k), 11);
      TypedWeights w = make_weights(static_cast<size_t>(s.n * s.k), dtype, 12);
      std::vector<float> y(static_cast<size_t>(s.m * s.n), kPoison);
      ASSERT_TRUE(backend_->linear(MatrixView::dense(x.data(), DType::kF32, s.m, s.k),
                                   MatrixView::dense(w.bytes.data(), dtype, s.n, s.k),
                                   MatrixView::dense(y.data(), DType::kF32, s.m, s.n)).ok());
      std::vector<double> expected(y.size()), unrounded(y.size());
      for (int64_t i = 0; i < s.m; ++i) {
        for (int64_t j = 0; j < s.n; ++j) {
          double sum = 0, exact = 0;
          for (int64_t kk = 0; kk < s.k; ++kk) {
            const float xv = x[i * s.k + kk];
            sum += double{rounded ? round_bf16(xv) : xv} * w.values[j * s.k + kk];
            exact += double{xv} * w.values[j * s.k + kk];
          }
          expected[static_cast<size_t>(i * s.n + j)] = sum;
          unrounded[static_cast<size_t>(i * s.n + j)] = exact;
        }
      }
      const std::string what = "linear " + std::string(dtype_name(dtype)) + " " +
                               std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
                               std::to_string(s.k);
      expect_close(y, expected, 2e-5 * std::sqrt(static_cast<double>(s.k)), what);
      // Rounding the activations moves a product by at most 2^-9 of it.
      if (rounded)
        expect_close(y, unrounded, 4e-3 * std::sqrt(static_cast<double>(s.k)), what + " unrounded");
    }
  }
}

TEST_P(BackendOps, LinearRowsAreBitwiseIndependentOfBatchAndThreads) {
  // k % 8, k % 16 and k % 32 != 0 exercise every level's tail; 5000 > the bf16 level's 4096-wide
  // activation chunks; n = 300 leaves partial column tiles.
  for (int64_t k : {int64_t{1000}, int64_t{5000}}) {
    for (DType dtype : {DType::kBF16, DType::kF32}) {
      const int64_t m = 9, n = 300;
      std::vector<float> x = random_floats(static_cast<size_t>(m * k), 21);
      TypedWeights w = make_weights(static_cast<size_t>(n * k), dtype, 22);
      std::vector<float> batched(static_cast<size_t>(m * n));
      LinearProblem p{x.data(), k, w.bytes.data(), dtype, k, batched.data(), n, m, n, k};
      CpuThreadPool one_thread(1), two_threads(2), three_threads(3);
      ASSERT_TRUE(linear_cpu(p, two_threads, GetParam()).ok());
      for (int64_t i = 0; i < m; ++i) {
        std::vector<float> single(static_cast<size_t>(n));
        LinearProblem one{x.data() + i * k, k, w.bytes.data(), dtype, k, single.data(), n, 1, n, k};
        ASSERT_TRUE(linear_cpu(one, one_thread, GetParam()).ok());
        for (int64_t j = 0; j < n; ++j) ASSERT_EQ(single[j], batched[i * n + j]) << i << "," << j;
      }
      // Three rows at once on three threads: other row and column tiles, same bits.
      std::vector<float> three(static_cast<size_t>(3 * n));
      LinearProblem part{x.data() + 4 * k, k, w.bytes.data(), dtype, k, three.data(), n, 3, n, k};
      ASSERT_TRUE(linear_cpu(part, three_threads, GetParam()).ok());
      for (int64_t j = 0; j < 3 * n; ++j) ASSERT_EQ(three[j], batched[4 * n + j]) << j;
      if (GetParam() == CpuIsa::kPortable || GetParam() == CpuIsa::kAvx2) {
        // The portable path is the specification of the avx2 path's order.
        std::vector<float> portable(static_cast<size_t>(m * n));
        LinearProblem q = p;
        q.y = portable.data();
        linear_cpu_columns_portable(q, 0, n);
        EXPECT_EQ(portable, batched);
      }
    }
  }
}

TEST(LinearCpu, RefusesALevelTheCpuDoesNotRun) {
  std::vector<float> x(8), y(1), w(8);
  LinearProblem p{x.data(), 8, w.data(), DType::kF32, 8, y.data(), 1, 1, 1, 8};
  CpuThreadPool pool(1);
  EXPECT_EQ(linear_cpu(p, pool, CpuIsa::kAuto).code(), StatusCode::kInvalidArgument);
}

// The avx2 primitives follow the portable order exactly; a CPU without AVX2 must refuse the
// level instead of running them.
TEST(VectorMath, Avx2PrimitivesMatchPortableBitwise) {
  if (!cpu_supports(CpuIsa::kAvx2)) {
    EXPECT_FALSE(make_cpu_backend(1, CpuIsa::kAvx2).ok());
    return;
  }
  std::vector<float> a = random_floats(131, 31);
  for (DType dtype : {DType::kBF16, DType::kF16, DType::kF32}) {
    TypedWeights b = make_weights(131, dtype, 32);
    EXPECT_EQ(avx2::dot_f32(a.data(), b.bytes.data(), dtype, 131),
              portable::dot_f32(a.data(), b.bytes.data(), dtype, 131));
    std::vector<float> y1 = random_floats(131, 33), y2 = y1;
    avx2::axpy_f32(0.37f, b.bytes.data(), dtype, y1.data(), 131);
    portable::axpy_f32(0.37f, b.bytes.data(), dtype, y2.data(), 131);
    EXPECT_EQ(y1, y2);
  }
}

double reference_inv_rms(const float* x, int64_t n, double eps) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double{x[i]} * x[i];
  return 1.0 / std::sqrt(sum / static_cast<double>(n) + eps);
}

TEST_P(BackendOps, RmsNormAndFusedResidualAdd) {
  const int64_t rows = 6, cols = 72;
  const float eps = 1e-6f;
  std::vector<float> x = random_floats(static_cast<size_t>(rows * cols), 41);
  std::vector<float> residual = random_floats(x.size(), 42);
  TypedWeights w = make_weights(static_cast<size_t>(cols), DType::kBF16, 43);
  VectorView weight{w.bytes.data(), DType::kBF16, cols};

  std::vector<float> out(x.size(), kPoison);
  ASSERT_TRUE(backend_->rms_norm(MatrixView::dense(x.data(), DType::kF32, rows, cols), weight, eps,
                                 MatrixView::dense(out.data(), DType::kF32, rows, cols)).ok());
  std::vector<double> expected(x.size());
  for (int64_t i = 0; i < rows; ++i) {
    double inv = reference_inv_rms(&x[i * cols], cols, eps);
    for (int64_t j = 0; j < cols; ++j) expected[i * cols + j] = x[i * cols + j] * inv * w.values[j];
  }
  expect_close(out, expected, 1e-6, "rms_norm");

  std::vector<float> sum(x.size());
  for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + residual[i];
  for (int64_t i = 0; i < rows; ++i) {
    double inv = reference_inv_rms(&sum[i * cols], cols, eps);
    for (int64_t j = 0; j < cols; ++j) expected[i * cols + j] = sum[i * cols + j] * inv * w.values[j];
  }
  ASSERT_TRUE(backend_->add_rms_norm(MatrixView::dense(x.data(), DType::kF32, rows, cols),
                                     MatrixView::dense(residual.data(), DType::kF32, rows, cols),
                                     weight, eps).ok());
  EXPECT_EQ(residual, sum);
  expect_close(x, expected, 1e-6, "add_rms_norm");
}

TEST_P(BackendOps, EmbeddingSiluMulGather) {
  const int64_t vocab = 20, width = 12;
  TypedWeights table = make_weights(static_cast<size_t>(vocab * width), DType::kF16, 51);
  std::vector<int32_t> ids = {3, 19, 0, 3};
  std::vector<float> out(ids.size() * width, kPoison);
  ASSERT_TRUE(backend_->embedding(MatrixView::dense(table.bytes.data(), DType::kF16, vocab, width),
                                  ids.data(), MatrixView::dense(out.data(), DType::kF32, 4, width)).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int64_t j = 0; j < width; ++j) EXPECT_EQ(out[i * width + j], table.values[ids[i] * width + j]);
  }
  std::vector<int32_t> bad_ids = {20};
  EXPECT_EQ(backend_->embedding(MatrixView::dense(table.bytes.data(), DType::kF16, vocab, width),
                                bad_ids.data(), MatrixView::dense(out.data(), DType::kF32, 1, width))
                .code(),
            StatusCode::kInvalidArgument);

  // silu_mul over column slices of one fused buffer, as the model uses it.
  std::vector<float> gate_up = random_floats(4 * 2 * width, 52, 3.0f);
  MatrixView fused = MatrixView::dense(gate_up.data(), DType::kF32, 4, 2 * width);
  std::vector<float> act(4 * width, kPoison);
  ASSERT_TRUE(backend_->silu_mul(fused.column_slice(0, width), fused.column_slice(width, width),
                                 MatrixView::dense(act.data(), DType::kF32, 4, width)).ok());
  std::vector<double> expected(act.size());
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < width; ++j) {
      double g = gate_up[i * 2 * width + j], u = gate_up[i * 2 * width + width + j];
      expected[i * width + j] = g / (1.0 + std::exp(-g)) * u;
    }
  }
  expect_close(act, expected, 1e-6, "silu_mul");

  std::vector<int32_t> rows = {2, 0};
  std::vector<float> gathered(2 * width, kPoison);
  ASSERT_TRUE(backend_->gather_rows(MatrixView::dense(act.data(), DType::kF32, 4, width), rows.data(),
                                    MatrixView::dense(gathered.data(), DType::kF32, 2, width)).ok());
  EXPECT_TRUE(std::equal(gathered.begin(), gathered.begin() + width, act.begin() + 2 * width));
  EXPECT_TRUE(std::equal(gathered.begin() + width, gathered.end(), act.begin()));
}

// A small paged pool with a scattered block table, sequences in prefill and in decode.
struct AttentionFixture {
  int num_heads = 4, num_kv_heads = 2, head_dim = 16, block_size = 4, num_blocks = 12;
  DType kv_dtype = DType::kF32;
  std::vector<int> cached = {0, 9, 5};  // tokens already in the cache per sequence
  std::vector<int> fresh = {6, 1, 3};   // new tokens per sequence
  std::vector<std::vector<int32_t>> tables = {{7, 2}, {0, 11, 5}, {3, 9}};

  std::vector<float> k_pool, v_pool;  // float32 copies for the reference
  std::vector<std::byte> k_bytes, v_bytes;
  std::vector<int32_t> query_start, context_lens, block_tables, positions, slots;
  int max_blocks = 3;
  AttentionBatch batch;
  KvCacheView cache;

  int64_t token_elems() const { return int64_t{num_kv_heads} * head_dim; }
  KvLayout layout() const { return {1, num_blocks, block_size, num_kv_heads, head_dim, kv_dtype}; }
  // The pool slot of sequence s's token at position t, through its block table.
  int64_t slot_of(int s, int t) const {
    return kv_slot(layout(), tables[static_cast<size_t>(s)][static_cast<size_t>(t / block_size)],
                   t % block_size);
  }
  int total_new() const { return std::accumulate(fresh.begin(), fresh.end(), 0); }

  // A shape of its own: every sequence gets the blocks it needs, scattered over the pool.
  static AttentionFixture shaped(int heads, int kv_heads, int dim, int block,
                                 std::vector<int> cached_tokens, std::vector<int> fresh_tokens,
                                 uint32_t seed) {
    AttentionFixture f;
    f.num_heads = heads;
    f.num_kv_heads = kv_heads;
    f.head_dim = dim;
    f.block_size = block;
    f.cached = std::move(cached_tokens);
    f.fresh = std::move(fresh_tokens);
    f.tables.clear();
    f.max_blocks = 0;
    int total_blocks = 0;
    for (size_t s = 0; s < f.fresh.size(); ++s) {
      const int blocks = (f.cached[s] + f.fresh[s] + block - 1) / block;
      f.max_blocks = std::max(f.max_blocks, blocks);
      total_blocks += blocks;
    }
    f.num_blocks = total_blocks + 3;
    std::vector<int32_t> ids(static_cast<size_t>(f.num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
    size_t next = 0;
    for (size_t s = 0; s < f.fresh.size(); ++s) {
      const int blocks = (f.cached[s] + f.fresh[s] + block - 1) / block;
      f.tables.emplace_back(
          ids.begin() + static_cast<std::ptrdiff_t>(next),
          ids.begin() + static_cast<std::ptrdiff_t>(next + static_cast<size_t>(blocks)));
      next += static_cast<size_t>(blocks);
    }
    return f;
  }

  void build() {
    const auto pool = static_cast<size_t>(layout().layer_elements());
    k_bytes.assign(pool * dtype_size(kv_dtype), std::byte{0});
    v_bytes.assign(pool * dtype_size(kv_dtype), std::byte{0});
    query_start = {0};
    for (size_t s = 0; s < fresh.size(); ++s) {
      const int context = cached[s] + fresh[s];
      query_start.push_back(query_start.back() + fresh[s]);
      context_lens.push_back(context);
      for (int b = 0; b < max_blocks; ++b) {
        block_tables.push_back(b < static_cast<int>(tables[s].size()) ? tables[s][static_cast<size_t>(b)] : 0);
      }
      for (int t = cached[s]; t < context; ++t) {
        positions.push_back(t);
        slots.push_back(static_cast<int32_t>(slot_of(static_cast<int>(s), t)));
      }
    }
    batch.num_seqs = static_cast<int>(fresh.size());
    batch.num_tokens = total_new();
    batch.max_blocks_per_seq = max_blocks;
    batch.query_start = query_start.data();
    batch.context_lens = context_lens.data();
    batch.block_tables = block_tables.data();
    batch.positions = positions.data();
    batch.slot_mapping = slots.data();
    cache = {k_bytes.data(), v_bytes.data(), layout()};
  }

  // Fills the cached (not new) positions of every sequence with random K/V.
  void fill_cached(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (size_t s = 0; s < fresh.size(); ++s) {
      for (int t = 0; t < cached[s]; ++t) {
        const int64_t first = kv_element(layout(), 0, slot_of(static_cast<int>(s), t));
        for (int64_t e = first; e < first + token_elems(); ++e) {
          const float kv[2] = {dist(rng), dist(rng)};
          convert_elements(&kv[0], DType::kF32, k_bytes.data() + e * dtype_size(kv_dtype), kv_dtype,
                           1);
          convert_elements(&kv[1], DType::kF32, v_bytes.data() + e * dtype_size(kv_dtype), kv_dtype,
                           1);
        }
      }
    }
  }

  float k_at(int s, int t, int head, int d) const { return element(k_bytes, s, t, head, d); }
  float v_at(int s, int t, int head, int d) const { return element(v_bytes, s, t, head, d); }
  float element(const std::vector<std::byte>& pool, int s, int t, int head, int d) const {
    return load_as_float(pool.data(), kv_dtype,
                         static_cast<size_t>(kv_element(layout(), 0, slot_of(s, t), head, d)));
  }
};

// The fixture's new tokens' K/V written through the cache-write op (identity norms, so only
// RoPE moves them), then attention of all new tokens in one call.
struct AttentionRun {
  std::vector<float> q;  // after RoPE
  std::vector<float> out;
};

AttentionRun run_attention(Backend& backend, AttentionFixture& f, uint32_t seed) {
  const int tokens = f.total_new();
  const int64_t q_width = int64_t{f.num_heads} * f.head_dim;
  AttentionRun run;
  run.q = random_floats(static_cast<size_t>(tokens * q_width), seed);
  std::vector<float> k = random_floats(static_cast<size_t>(tokens * f.token_elems()), seed + 1);
  std::vector<float> v = random_floats(k.size(), seed + 2);
  std::vector<float> ones(static_cast<size_t>(f.head_dim), 1.0f);
  QkNormRopeParams params{{ones.data(), DType::kF32, f.head_dim},
                          {ones.data(), DType::kF32, f.head_dim},
                          1e-6f,
                          10000.0,
                          f.num_heads,
                          f.num_kv_heads,
                          f.head_dim};
  EXPECT_TRUE(
      backend
          .qk_norm_rope_kv_write(MatrixView::dense(run.q.data(), DType::kF32, tokens, q_width),
                                 MatrixView::dense(k.data(), DType::kF32, tokens, f.token_elems()),
                                 MatrixView::dense(v.data(), DType::kF32, tokens, f.token_elems()),
                                 params, f.batch, f.cache, 0)
          .ok());
  run.out.assign(run.q.size(), kPoison);
  const float scale = 1.0f / std::sqrt(static_cast<float>(f.head_dim));
  EXPECT_TRUE(backend
                  .paged_attention(MatrixView::dense(run.q.data(), DType::kF32, tokens, q_width),
                                   f.batch, f.cache, 0, f.num_heads, scale,
                                   MatrixView::dense(run.out.data(), DType::kF32, tokens, q_width))
                  .ok());
  return run;
}

std::vector<AttentionFixture> attention_shapes(DType kv_dtype) {
  std::vector<AttentionFixture> shapes;
  shapes.emplace_back();  // head_dim 16: the avx2 kernel at every level above portable
  // The Qwen3-0.6B head shape: a 45-token prompt (tiles of 16 tokens), a decode, a chunk.
  shapes.push_back(AttentionFixture::shaped(16, 8, 128, 16, {0, 40, 17}, {45, 1, 3}, 1));
  // Eight heads per KV head, 32-token blocks, a prompt chunk after 70 cached tokens.
  shapes.push_back(AttentionFixture::shaped(8, 1, 64, 32, {0, 70}, {20, 1}, 2));
  // 40 heads per KV head: more than one tile's worth of heads.
  shapes.push_back(AttentionFixture::shaped(40, 1, 32, 8, {3}, {5}, 3));
  shapes.push_back(AttentionFixture::shaped(4, 2, 256, 16, {10}, {30}, 4));
  // A head size without its own kernel instance.
  shapes.push_back(AttentionFixture::shaped(2, 1, 96, 16, {20}, {2}, 5));
  for (AttentionFixture& f : shapes) {
    f.kv_dtype = kv_dtype;
    f.build();
    f.fill_cached(61);
  }
  return shapes;
}

TEST_P(BackendOps, PagedAttentionMatchesDenseSoftmaxReference) {
  for (DType kv_dtype : {DType::kF32, DType::kBF16}) {
    for (AttentionFixture& f : attention_shapes(kv_dtype)) {
      // The avx512_bf16 level scores a bf16 cache with bf16 queries (see rounds_to_bf16), with
      // its vector kernel: head sizes that are multiples of 32 up to 256.
      const bool rounded =
          rounds_to_bf16(GetParam(), kv_dtype) && f.head_dim % 32 == 0 && f.head_dim <= 256;
      const AttentionRun run = run_attention(*backend_, f, 62);
      const int64_t q_width = int64_t{f.num_heads} * f.head_dim;
      const float scale = 1.0f / std::sqrt(static_cast<float>(f.head_dim));
      std::vector<double> expected(run.out.size());
      const int group = f.num_heads / f.num_kv_heads;
      for (int s = 0; s < f.batch.num_seqs; ++s) {
        for (int t = f.query_start[s]; t < f.query_start[s + 1]; ++t) {
          const int position = f.positions[static_cast<size_t>(t)];
          for (int h = 0; h < f.num_heads; ++h) {
            std::vector<double> scores;
            for (int u = 0; u <= position; ++u) {
              double dot = 0;
              for (int d = 0; d < f.head_dim; ++d) {
                const float qv = run.q[t * q_width + h * f.head_dim + d];
                dot += double{rounded ? round_bf16(qv) : qv} * f.k_at(s, u, h / group, d);
              }
              scores.push_back(dot * scale);
            }
            const double max_score = *std::max_element(scores.begin(), scores.end());
            double total = 0;
            for (double& sc : scores) total += (sc = std::exp(sc - max_score));
            for (int d = 0; d < f.head_dim; ++d) {
              double acc = 0;
              for (int u = 0; u <= position; ++u)
                acc += scores[static_cast<size_t>(u)] * f.v_at(s, u, h / group, d);
              expected[static_cast<size_t>(t * q_width + h * f.head_dim + d)] = acc / total;
            }
          }
        }
      }
      expect_close(run.out, expected, 1e-5,
                   "paged_attention " + std::string(dtype_name(kv_dtype)) + " head_dim " +
                       std::to_string(f.head_dim) + " group " + std::to_string(group));
    }
  }
}

// A token's attention output is the same bits whether it was computed with its whole prompt
// (a tile of many tokens, other sequences in the batch) or alone as a decode step.
TEST_P(BackendOps, PagedAttentionOfATokenDoesNotDependOnItsBatch) {
  for (DType kv_dtype : {DType::kF32, DType::kBF16}) {
    for (AttentionFixture& f : attention_shapes(kv_dtype)) {
      const AttentionRun run = run_attention(*backend_, f, 81);
      const int64_t q_width = int64_t{f.num_heads} * f.head_dim;
      const float scale = 1.0f / std::sqrt(static_cast<float>(f.head_dim));
      for (int s = 0; s < f.batch.num_seqs; ++s) {
        for (int t = f.query_start[s]; t < f.query_start[s + 1]; ++t) {
          const int32_t position = f.positions[static_cast<size_t>(t)];
          const int32_t query_start[2] = {0, 1};
          const int32_t context = position + 1;
          AttentionBatch one = f.batch;
          one.num_seqs = 1;
          one.num_tokens = 1;
          one.query_start = query_start;
          one.context_lens = &context;
          one.block_tables = f.block_tables.data() + static_cast<ptrdiff_t>(s) * f.max_blocks;
          one.positions = &position;
          one.slot_mapping = f.slots.data() + t;
          std::vector<float> out(static_cast<size_t>(q_width), kPoison);
          ASSERT_TRUE(backend_
                          ->paged_attention(
                              MatrixView::dense(const_cast<float*>(run.q.data()) + t * q_width,
                                                DType::kF32, 1, q_width),
                              one, f.cache, 0, f.num_heads, scale,
                              MatrixView::dense(out.data(), DType::kF32, 1, q_width))
                          .ok());
          for (int64_t e = 0; e < q_width; ++e) {
            ASSERT_EQ(out[static_cast<size_t>(e)], run.out[static_cast<size_t>(t * q_width + e)])
                << "head_dim " << f.head_dim << " token " << t << " element " << e;
          }
        }
      }
    }
  }
}

TEST_P(BackendOps, QkNormRopeWritesRotatedKeysAtTheirSlots) {
  AttentionFixture f;
  f.build();
  const int tokens = f.total_new();
  const int64_t q_width = int64_t{f.num_heads} * f.head_dim;
  std::vector<float> q = random_floats(static_cast<size_t>(tokens * q_width), 71);
  std::vector<float> k = random_floats(static_cast<size_t>(tokens * f.token_elems()), 72);
  std::vector<float> v = random_floats(k.size(), 73);
  const std::vector<float> q_in = q, k_in = k;
  TypedWeights q_norm = make_weights(static_cast<size_t>(f.head_dim), DType::kBF16, 74);
  TypedWeights k_norm = make_weights(static_cast<size_t>(f.head_dim), DType::kBF16, 75);
  const double theta = 1e6;
  QkNormRopeParams params{{q_norm.bytes.data(), DType::kBF16, f.head_dim},
                          {k_norm.bytes.data(), DType::kBF16, f.head_dim},
                          1e-6f, theta, f.num_heads, f.num_kv_heads, f.head_dim};
  ASSERT_TRUE(backend_->qk_norm_rope_kv_write(MatrixView::dense(q.data(), DType::kF32, tokens, q_width),
                                              MatrixView::dense(k.data(), DType::kF32, tokens, f.token_elems()),
                                              MatrixView::dense(v.data(), DType::kF32, tokens, f.token_elems()),
                                              params, f.batch, f.cache, 0).ok());
  // Reference: rotation by complex multiplication of (x[j], x[j + d/2]) with e^{i * angle}.
  const auto reference = [&](const float* head, const std::vector<float>& norm, int position) {
    const double inv = reference_inv_rms(head, f.head_dim, 1e-6);
    std::vector<double> normed(static_cast<size_t>(f.head_dim)), rotated(normed.size());
    for (int d = 0; d < f.head_dim; ++d) normed[static_cast<size_t>(d)] = head[d] * inv * norm[static_cast<size_t>(d)];
    const int half = f.head_dim / 2;
    for (int j = 0; j < half; ++j) {
      const double angle = position / std::pow(theta, 2.0 * j / f.head_dim);
      const std::complex<double> z(normed[static_cast<size_t>(j)], normed[static_cast<size_t>(j + half)]);
      const std::complex<double> r = z * std::polar(1.0, angle);
      rotated[static_cast<size_t>(j)] = r.real();
      rotated[static_cast<size_t>(j + half)] = r.imag();
    }
    return rotated;
  };
  for (int t = 0; t < tokens; ++t) {
    const int position = f.positions[static_cast<size_t>(t)];
    for (int h = 0; h < f.num_heads; ++h) {
      std::vector<double> expected = reference(&q_in[t * q_width + h * f.head_dim], q_norm.values, position);
      for (int d = 0; d < f.head_dim; ++d) ASSERT_NEAR(q[t * q_width + h * f.head_dim + d], expected[d], 1e-5);
    }
    const int64_t first = kv_element(f.layout(), 0, f.slots[static_cast<size_t>(t)]);
    const float* k_cached = reinterpret_cast<const float*>(f.k_bytes.data()) + first;
    const float* v_cached = reinterpret_cast<const float*>(f.v_bytes.data()) + first;
    for (int h = 0; h < f.num_kv_heads; ++h) {
      std::vector<double> expected = reference(&k_in[t * f.token_elems() + h * f.head_dim], k_norm.values, position);
      for (int d = 0; d < f.head_dim; ++d) {
        ASSERT_NEAR(k_cached[h * f.head_dim + d], expected[d], 1e-5);
        ASSERT_EQ(v_cached[h * f.head_dim + d], v[t * f.token_elems() + h * f.head_dim + d]);
      }
    }
  }
}

TEST_P(BackendOps, MalformedCallsAreRejected) {
  std::vector<float> a(16), b(16), c(16);
  EXPECT_EQ(backend_->linear(MatrixView::dense(a.data(), DType::kF32, 2, 8),
                             MatrixView::dense(b.data(), DType::kF32, 2, 4),
                             MatrixView::dense(c.data(), DType::kF32, 2, 2)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->linear(MatrixView::dense(a.data(), DType::kBF16, 2, 8),
                             MatrixView::dense(b.data(), DType::kF32, 2, 8),
                             MatrixView::dense(c.data(), DType::kF32, 2, 2)).code(),
            StatusCode::kUnimplemented);
  AttentionFixture f;
  f.build();
  f.block_tables[0] = f.num_blocks;  // a block outside the pool
  std::vector<float> q(static_cast<size_t>(f.total_new() * f.num_heads * f.head_dim));
  std::vector<float> out(q.size());
  const int64_t width = int64_t{f.num_heads} * f.head_dim;
  EXPECT_EQ(backend_->paged_attention(MatrixView::dense(q.data(), DType::kF32, f.total_new(), width), f.batch,
                                      f.cache, 0, f.num_heads, 1.0f,
                                      MatrixView::dense(out.data(), DType::kF32, f.total_new(), width)).code(),
            StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Levels, BackendOps, ::testing::ValuesIn(supported_cpu_isas()), level_name);

// --kv-cache-dtype auto: float32 weights keep a float32 cache at every level (the CPU float32
// run is the reference of the CUDA strict float32 mode); only bf16 weights at the bf16 level,
// whose linear layers already round activations to bf16, get a bf16 cache.
TEST(CpuBackend, KvCacheAutoFollowsTheWeightsAndTheLevel) {
  for (const CpuIsa isa : supported_cpu_isas()) {
    SCOPED_TRACE(cpu_isa_name(isa));
    std::unique_ptr<Backend> backend = make_cpu_backend(1, isa).value();
    EXPECT_EQ(backend->default_kv_dtype(DType::kF32), DType::kF32);
    EXPECT_EQ(backend->default_kv_dtype(DType::kBF16),
              isa == CpuIsa::kAvx512Bf16 ? DType::kBF16 : DType::kF32);
  }
}

TEST(BackendFactory, CudaIsRefusedClearlyWithoutAGpu) {
  BackendOptions options;
  options.device = DeviceKind::kCuda;
  Result<std::unique_ptr<Backend>> backend = create_backend(options);
  ASSERT_FALSE(backend.ok());
  EXPECT_NE(backend.status().message().find("--device cuda"), std::string::npos);
  EXPECT_FALSE(parse_device_kind("tpu").ok());
}

TEST(BackendFactory, ParsesDeviceNamesWithACudaIndex) {
  struct Case {
    const char* name;
    DeviceKind kind;
    int index;
  };
  for (const Case& c : {Case{"cpu", DeviceKind::kCpu, 0}, Case{"cuda", DeviceKind::kCuda, 0},
                        Case{"cuda:0", DeviceKind::kCuda, 0}, Case{"cuda:3", DeviceKind::kCuda, 3},
                        Case{"cuda:12", DeviceKind::kCuda, 12}}) {
    Result<DeviceSpec> spec = parse_device(c.name);
    ASSERT_TRUE(spec.ok()) << c.name << ": " << spec.status().to_string();
    EXPECT_EQ(spec->kind, c.kind) << c.name;
    EXPECT_EQ(spec->index, c.index) << c.name;
  }
  for (const char* bad :
       {"", "tpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1x", "cpu:0", "cuda:1:2", "CUDA", " cuda"}) {
    Result<DeviceSpec> spec = parse_device(bad);
    ASSERT_FALSE(spec.ok()) << "'" << bad << "' was taken";
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  // The index reaches the backend options, and an absent device is refused naming it.
  Result<ModelLoadOptions> options = model_load_options("cuda:7", 0, "");
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options->backend.device, DeviceKind::kCuda);
  EXPECT_EQ(options->backend.device_index, 7);
  Result<std::unique_ptr<Backend>> backend = create_backend(options->backend);
  ASSERT_FALSE(backend.ok());
  EXPECT_NE(backend.status().message().find("--device cuda"), std::string::npos)
      << backend.status().message();
}

}  // namespace
}  // namespace pdserve
