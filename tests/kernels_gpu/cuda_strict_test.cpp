// Tests that catch wrong CUDA kernels (issue #13 item 4), and the strict float32 mode
// (item 3). Every output is held to a per-row relative error (kernel_check.h) against the CPU
// backend or a double-precision host reference:
//  - every op in strict float32 against the CPU backend (float32 too: the errors must be those
//    of float arithmetic, about 1e-6);
//  - paged attention with peaked scores on keys planted at block, tile and split-K boundaries
//    (where a tiled or split kernel can drop or repeat a key), contexts up to 32k, float32 and
//    bfloat16 activations and KV;
//  - real-size GEMMs (K = 12,288 and N = 24,576; every Qwen3-8B projection and its lm_head) in
//    bf16 and in pedantic float32, whose tolerance a TF32 GEMM would fail;
//  - a synthetic 2-layer Qwen3-0.6B-shape model, strict float32 against the CPU backend;
//  - decode steps replayed from CUDA graphs against eager steps, in both precisions.
// gpu_test_main.h: exit 77 without a device; PDSERVE_GPU_TESTS_ON_CPU=1 runs the tests whose
// name lacks "Cuda" on the CPU backend instead (the kernels_gpu_checks_on_cpu CTest).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/model/checkpoint.h"
#include "common/model/qwen3_weights.h"
#include "common/model/synthetic_checkpoint.h"
#include "kernels/cuda_attention_plan.h"
#include "kernels/model/kv_cache.h"
#include "kernels/model/qwen3_model.h"
#include "tests/kernels_gpu/gpu_test_main.h"
#include "tests/kernels_gpu/kernel_check.h"
#ifdef PDSERVE_WITH_CUDA
#include "kernels/cuda_backend.h"
#include "kernels/model/gpu_graph_runner.h"
#endif

namespace pdserve {
namespace {

using gpu_test::device_ints;
using gpu_test::DeviceMatrix;
using kernel_check::PagedProblem;
using kernel_check::RowErrors;

// Per-row relative tolerances. Float32 results differ from the CPU backend or the double
// reference only by float rounding (sums in another order: ~1e-6); bf16 outputs add one bf16
// rounding (2^-9 per element, about 1.1e-3 over a row).
constexpr double kFloat32OpTolerance = 1e-5;
constexpr double kFloat32AttentionTolerance = 5e-5;
constexpr double kBf16OutputTolerance = 4e-3;
// GEMMs with K up to 12,288 accumulated in float32: ~1e-5 at most; TF32 (10-bit mantissa)
// would be ~3e-4.
constexpr double kFloat32GemmTolerance = 5e-5;

std::string dtype_label(DType dtype) {
  return dtype == DType::kF32 ? "f32" : "bf16";
}

void expect_rows(const RowErrors& errors, double tolerance, const std::string& what) {
  EXPECT_TRUE(errors.within(tolerance)) << what << ": " << errors.describe() << " > " << tolerance;
  std::printf("  %-64s %s\n", what.c_str(), errors.describe().c_str());
}

int multiprocessors(Backend& backend) {
#ifdef PDSERVE_WITH_CUDA
  if (!gpu_test::on_cpu()) return cuda_memory_info(backend).value().multiprocessors;
#endif
  static_cast<void>(backend);
  return 132;  // an H100's, for the split plan the CPU run plants at
}

// ---- strict float32: the mode and every op against the CPU backend ----------------------

TEST(StrictFloat32, TheBackendComputesInFloat32) {
  std::unique_ptr<Backend> device = gpu_test::backend_under_test(DType::kF32);
  ASSERT_NE(device, nullptr);
  EXPECT_EQ(device->activation_dtype(), DType::kF32);
  if (!gpu_test::on_cpu()) {
    EXPECT_NE(device->description().find("strict float32"), std::string::npos)
        << device->description();
  }
}

TEST(StrictFloat32, DefaultCudaBackendStaysBf16Cuda) {
  PDS_REQUIRE_CUDA();
  BackendOptions options;
  options.device = DeviceKind::kCuda;
  std::unique_ptr<Backend> device = std::move(create_backend(options)).value();
  EXPECT_EQ(device->activation_dtype(), DType::kBF16);
}

TEST(StrictFloat32, NormsSiluEmbeddingAndGatherMatchTheCpu) {
  std::unique_ptr<Backend> device = gpu_test::backend_under_test(DType::kF32);
  std::unique_ptr<Backend> cpu = gpu_test::cpu_reference();
  ASSERT_NE(device, nullptr);
  const auto host = [](std::vector<float>& v, int64_t rows, int64_t cols) {
    return MatrixView::dense(v.data(), DType::kF32, rows, cols);
  };
  for (int64_t rows : {1, 7, 64}) {
    for (int64_t cols : {128, 1024, 4096}) {
      const std::string shape = std::to_string(rows) + "x" + std::to_string(cols);
      // Row scales over six orders of magnitude: each row is held to its own precision.
      std::vector<float> in = kernel_check::uniform_floats(static_cast<size_t>(rows * cols), 1);
      for (int64_t r = 0; r < rows; ++r) {
        const float scale = std::pow(10.0f, static_cast<float>(r % 7) - 3.0f);
        for (int64_t c = 0; c < cols; ++c) in[static_cast<size_t>(r * cols + c)] *= scale;
      }
      std::vector<float> add = kernel_check::uniform_floats(static_cast<size_t>(rows * cols), 2);
      std::vector<float> weight = kernel_check::uniform_floats(static_cast<size_t>(cols), 3, 0.1f);
      for (float& w : weight) w += 1.0f;
      const VectorView cpu_weight{weight.data(), DType::kF32, cols};
      DeviceMatrix dweight(*device, weight, DType::kF32, 1, cols);

      std::vector<float> expected(in.size());
      ASSERT_TRUE(
          cpu->rms_norm(host(in, rows, cols), cpu_weight, 1e-6f, host(expected, rows, cols)).ok());
      DeviceMatrix din(*device, in, DType::kF32, rows, cols);
      DeviceMatrix dout = DeviceMatrix::poisoned(*device, DType::kF32, rows, cols);
      ASSERT_TRUE(device->rms_norm(din.view(), dweight.vector(), 1e-6f, dout.view()).ok());
      expect_rows(kernel_check::row_errors(dout.download(), expected, rows, cols),
                  kFloat32OpTolerance, "rms_norm " + shape);

      std::vector<float> x = add, residual = in;
      ASSERT_TRUE(
          cpu->add_rms_norm(host(x, rows, cols), host(residual, rows, cols), cpu_weight, 1e-6f)
              .ok());
      DeviceMatrix dx(*device, add, DType::kF32, rows, cols);
      DeviceMatrix dresidual(*device, in, DType::kF32, rows, cols);
      ASSERT_TRUE(device->add_rms_norm(dx.view(), dresidual.view(), dweight.vector(), 1e-6f).ok());
      expect_rows(kernel_check::row_errors(dresidual.download(), residual, rows, cols),
                  kFloat32OpTolerance, "add_rms_norm residual " + shape);
      expect_rows(kernel_check::row_errors(dx.download(), x, rows, cols), kFloat32OpTolerance,
                  "add_rms_norm output " + shape);

      std::vector<float> act(in.size());
      std::vector<float> gate = kernel_check::uniform_floats(in.size(), 4, 6.0f);
      ASSERT_TRUE(
          cpu->silu_mul(host(gate, rows, cols), host(in, rows, cols), host(act, rows, cols)).ok());
      DeviceMatrix dgate(*device, gate, DType::kF32, rows, cols);
      DeviceMatrix dact = DeviceMatrix::poisoned(*device, DType::kF32, rows, cols);
      ASSERT_TRUE(device->silu_mul(dgate.view(), din.view(), dact.view()).ok());
      expect_rows(kernel_check::row_errors(dact.download(), act, rows, cols), kFloat32OpTolerance,
                  "silu_mul " + shape);
    }
  }

  const int64_t vocab = 1000, width = 1024;
  std::vector<float> table = kernel_check::uniform_floats(static_cast<size_t>(vocab * width), 5);
  const std::vector<int32_t> ids = {0, 999, 5, 5, 17, 500, 1};
  const int64_t tokens = static_cast<int64_t>(ids.size());
  std::vector<float> embedded(static_cast<size_t>(tokens * width));
  ASSERT_TRUE(
      cpu->embedding(host(table, vocab, width), ids.data(), host(embedded, tokens, width)).ok());
  DeviceMatrix dtable(*device, table, DType::kF32, vocab, width);
  DeviceBuffer dids = device_ints(*device, ids);
  DeviceMatrix dembedded = DeviceMatrix::poisoned(*device, DType::kF32, tokens, width);
  ASSERT_TRUE(device->embedding(dtable.view(), dids.as<int32_t>(), dembedded.view()).ok());
  EXPECT_EQ(dembedded.download(), embedded) << "embedding copies float32 rows exactly";
  const std::vector<int32_t> rows = {6, 0, 3};
  std::vector<float> gathered(rows.size() * width);
  ASSERT_TRUE(
      cpu->gather_rows(host(embedded, tokens, width), rows.data(), host(gathered, 3, width)).ok());
  DeviceBuffer drows = device_ints(*device, rows);
  DeviceMatrix dgathered = DeviceMatrix::poisoned(*device, DType::kF32, 3, width);
  ASSERT_TRUE(device->gather_rows(dembedded.view(), drows.as<int32_t>(), dgathered.view()).ok());
  EXPECT_EQ(dgathered.download(), gathered);
  ASSERT_TRUE(device->synchronize().ok());
}

// A view of another activation dtype than the call's others is refused, never converted.
TEST(StrictFloat32, MixedActivationDtypesAreRefusedCuda) {
  PDS_REQUIRE_CUDA();
  std::unique_ptr<Backend> device = gpu_test::backend_under_test(DType::kF32);
  std::vector<float> values(64, 1.0f);
  DeviceMatrix f32(*device, values, DType::kF32, 1, 64);
  DeviceMatrix bf16(*device, values, DType::kBF16, 1, 64);
  const Status status = device->silu_mul(f32.view(), bf16.view(), f32.view());
  EXPECT_EQ(status.code(), StatusCode::kUnimplemented) << status.to_string();
  EXPECT_NE(status.message().find("all bfloat16 or all float32"), std::string::npos)
      << status.to_string();
}

// qk_norm_rope_kv_write in float32 with float32 and bf16 pools, against the CPU backend.
TEST(StrictFloat32, NormRopeKvWriteMatchesTheCpu) {
  std::unique_ptr<Backend> device = gpu_test::backend_under_test(DType::kF32);
  std::unique_ptr<Backend> cpu = gpu_test::cpu_reference();
  ASSERT_NE(device, nullptr);
  const int heads = 16, kv_heads = 8, head_dim = 128, block_size = 16;
  for (DType kv_dtype : {DType::kF32, DType::kBF16}) {
    PagedProblem p =
        kernel_check::make_paged_problem(heads, kv_heads, head_dim, block_size, {37, 1, 5},
                                         {100, 40000, 5}, DType::kF32, kv_dtype, 31);
    const int64_t tokens = p.num_tokens();
    const int64_t kv_width = int64_t{kv_heads} * head_dim;
    std::vector<float> k =
        kernel_check::uniform_floats(static_cast<size_t>(tokens * kv_width), 32, 3.0f);
    std::vector<float> v = kernel_check::uniform_floats(static_cast<size_t>(tokens * kv_width), 33);
    std::vector<float> q =
        kernel_check::uniform_floats(static_cast<size_t>(tokens * p.q_width()), 34, 3.0f);
    std::vector<float> q_norm = kernel_check::uniform_floats(head_dim, 35, 0.1f);
    std::vector<float> k_norm = kernel_check::uniform_floats(head_dim, 36, 0.1f);
    for (float& w : q_norm) w += 1.0f;
    for (float& w : k_norm) w += 1.0f;
    QkNormRopeParams rope;
    rope.rms_norm_eps = 1e-6f;
    rope.rope_theta = 1000000.0;
    rope.num_heads = heads;
    rope.num_kv_heads = kv_heads;
    rope.head_dim = head_dim;
    const AttentionBatch host_batch{
        p.num_seqs(),       p.num_tokens(),       p.max_blocks_per_seq,  p.max_query_len,
        p.max_context_len,  p.query_start.data(), p.context_lens.data(), p.block_tables.data(),
        p.positions.data(), p.slot_mapping.data()};
    // CPU: float32 pool holding the values as the device pool stores them.
    std::vector<float> cpu_q = q, cpu_k = k, cpu_v = v, cpu_k_pool = p.k_pool,
                       cpu_v_pool = p.v_pool;
    KvLayout cpu_layout = p.layout;
    cpu_layout.dtype = DType::kF32;
    rope.q_norm_weight = {q_norm.data(), DType::kF32, head_dim};
    rope.k_norm_weight = {k_norm.data(), DType::kF32, head_dim};
    ASSERT_TRUE(cpu->qk_norm_rope_kv_write(
                       MatrixView::dense(cpu_q.data(), DType::kF32, tokens, p.q_width()),
                       MatrixView::dense(cpu_k.data(), DType::kF32, tokens, kv_width),
                       MatrixView::dense(cpu_v.data(), DType::kF32, tokens, kv_width), rope,
                       host_batch, KvCacheView{cpu_k_pool.data(), cpu_v_pool.data(), cpu_layout}, 0)
                    .ok());
    const int64_t pool = static_cast<int64_t>(p.k_pool.size());
    DeviceMatrix dk_pool(*device, p.k_pool, kv_dtype, 1, pool),
        dv_pool(*device, p.v_pool, kv_dtype, 1, pool);
    DeviceMatrix dq(*device, q, DType::kF32, tokens, p.q_width());
    DeviceMatrix dk(*device, k, DType::kF32, tokens, kv_width),
        dv(*device, v, DType::kF32, tokens, kv_width);
    DeviceMatrix dq_norm(*device, q_norm, DType::kF32, 1, head_dim),
        dk_norm(*device, k_norm, DType::kF32, 1, head_dim);
    DeviceBuffer query_start = device_ints(*device, p.query_start),
                 context = device_ints(*device, p.context_lens),
                 tables = device_ints(*device, p.block_tables),
                 positions = device_ints(*device, p.positions),
                 slots = device_ints(*device, p.slot_mapping);
    AttentionBatch batch = host_batch;
    batch.query_start = query_start.as<int32_t>();
    batch.context_lens = context.as<int32_t>();
    batch.block_tables = tables.as<int32_t>();
    batch.positions = positions.as<int32_t>();
    batch.slot_mapping = slots.as<int32_t>();
    rope.q_norm_weight = dq_norm.vector();
    rope.k_norm_weight = dk_norm.vector();
    ASSERT_TRUE(device
                    ->qk_norm_rope_kv_write(dq.view(), dk.view(), dv.view(), rope, batch,
                                            KvCacheView{dk_pool.data(), dv_pool.data(), p.layout},
                                            0)
                    .ok());
    ASSERT_TRUE(device->synchronize().ok());
    const std::string what = "rope+kv write, kv " + dtype_label(kv_dtype);
    expect_rows(kernel_check::row_errors(dq.download(), cpu_q, tokens, p.q_width()),
                kFloat32OpTolerance, what + ": q");
    expect_rows(kernel_check::row_errors(dk.download(), cpu_k, tokens, kv_width),
                kFloat32OpTolerance, what + ": k");
    // The pools row by row (one row per slot); a bf16 pool adds its rounding.
    const double pool_tolerance =
        kv_dtype == DType::kF32 ? kFloat32OpTolerance : kBf16OutputTolerance;
    const int64_t slots_total = pool / kv_width;
    expect_rows(kernel_check::row_errors(dk_pool.download(), cpu_k_pool, slots_total, kv_width),
                pool_tolerance, what + ": K pool");
    expect_rows(kernel_check::row_errors(dv_pool.download(), cpu_v_pool, slots_total, kv_width),
                pool_tolerance, what + ": V pool");
  }
}

// ---- paged attention with planted keys ----------------------------------------------------

struct AttentionCase {
  std::string name;
  int num_heads, num_kv_heads, head_dim, block_size;
  std::vector<int> query_lens, context_lens;
  bool single;  // one planted key dominates (plant_peaked_keys)
};

using AttentionParam = std::tuple<AttentionCase, DType /*activation*/, DType /*kv*/>;
class PlantedAttention : public ::testing::TestWithParam<AttentionParam> {};

TEST_P(PlantedAttention, MatchesTheDoubleReference) {
  const auto& [c, activation, kv_dtype] = GetParam();
  std::unique_ptr<Backend> device = gpu_test::backend_under_test(activation);
  ASSERT_NE(device, nullptr);
  PagedProblem p = kernel_check::make_paged_problem(c.num_heads, c.num_kv_heads, c.head_dim,
                                                    c.block_size, c.query_lens, c.context_lens,
                                                    activation, kv_dtype, 41, true);
  AttentionShape shape;
  shape.num_seqs = p.num_seqs();
  shape.num_tokens = p.num_tokens();
  shape.max_query_len = p.max_query_len;
  shape.max_context_len = p.max_context_len;
  shape.num_heads = p.num_heads;
  shape.num_kv_heads = c.num_kv_heads;
  shape.head_dim = c.head_dim;
  const AttentionPlan plan = plan_paged_attention(shape, multiprocessors(*device)).value();
  std::vector<std::vector<int>> planted;
  for (int context : c.context_lens) {
    planted.push_back(kernel_check::boundary_positions(
        context, c.block_size, plan.num_splits > 1 ? plan.keys_per_split : 0, 16));
  }
  kernel_check::plant_peaked_keys(p, planted, 20.0f, c.single, 42);
  const std::vector<double> reference = kernel_check::reference_attention(p);

  const int64_t pool = static_cast<int64_t>(p.k_pool.size());
  DeviceMatrix dk_pool(*device, p.k_pool, kv_dtype, 1, pool),
      dv_pool(*device, p.v_pool, kv_dtype, 1, pool);
  DeviceMatrix dq(*device, p.q, activation, p.num_tokens(), p.q_width());
  DeviceMatrix dout = DeviceMatrix::poisoned(*device, activation, p.num_tokens(), p.q_width());
  DeviceBuffer query_start = device_ints(*device, p.query_start),
               context = device_ints(*device, p.context_lens),
               tables = device_ints(*device, p.block_tables),
               positions = device_ints(*device, p.positions),
               slots = device_ints(*device, p.slot_mapping);
  const AttentionBatch batch{p.num_seqs(),          p.num_tokens(),       p.max_blocks_per_seq,
                             p.max_query_len,       p.max_context_len,    query_start.as<int32_t>(),
                             context.as<int32_t>(), tables.as<int32_t>(), positions.as<int32_t>(),
                             slots.as<int32_t>()};
  const Status status = device->paged_attention(
      dq.view(), batch, KvCacheView{dk_pool.data(), dv_pool.data(), p.layout}, 0, p.num_heads,
      p.scale, dout.view());
  ASSERT_TRUE(status.ok()) << status.to_string();
  ASSERT_TRUE(device->synchronize().ok());
  const double tolerance =
      activation == DType::kF32 ? kFloat32AttentionTolerance : kBf16OutputTolerance;
  expect_rows(kernel_check::row_errors(dout.download(), reference, p.num_tokens(), p.q_width()),
              tolerance,
              c.name + " act " + dtype_label(activation) + " kv " + dtype_label(kv_dtype) + " (" +
                  std::to_string(plan.num_splits) + " splits of " +
                  std::to_string(plan.keys_per_split) + " keys)");
}

const AttentionCase kAttentionCases[] = {
    {"decode_boundaries",
     32,
     8,
     128,
     16,
     {1, 1, 1, 1, 1, 1, 1, 1},
     {1, 16, 17, 255, 256, 257, 4097, 8191},
     false},
    {"decode_32k_single", 32, 8, 128, 16, {1}, {32768}, true},
    {"decode_32k_spread", 32, 8, 128, 16, {1}, {32768}, false},
    {"decode_mixed_to_32k", 16, 8, 128, 16, {1, 1, 1, 1}, {32768, 1, 300, 16384}, false},
    {"prefill_chunk_over_32k", 16, 8, 128, 16, {32}, {32768}, false},
    {"prefill_whole_prompt", 16, 8, 64, 16, {300, 7}, {300, 7}, false},
    {"gqa16_hd256", 16, 1, 256, 8, {20, 1}, {45, 3000}, true},
    {"mha_hd64", 4, 4, 64, 32, {1, 1, 1}, {33, 64, 2049}, false},
};

std::string attention_name(const ::testing::TestParamInfo<AttentionParam>& info) {
  const auto& [c, activation, kv_dtype] = info.param;
  // bf16 activations only exist on CUDA: the CPU run filters out "*Cuda*".
  return c.name + "_act" + dtype_label(activation) + "_kv" + dtype_label(kv_dtype) +
         (activation == DType::kBF16 ? "_Cuda" : "");
}

INSTANTIATE_TEST_SUITE_P(Cases, PlantedAttention,
                         ::testing::Combine(::testing::ValuesIn(kAttentionCases),
                                            ::testing::Values(DType::kF32, DType::kBF16),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         attention_name);

// ---- real-size GEMMs ----------------------------------------------------------------------

struct GemmCase {
  std::string name;
  int64_t n, k;
};

using GemmParam = std::tuple<GemmCase, DType /*inputs*/, DType /*output*/>;
class RealSizeGemm : public ::testing::TestWithParam<GemmParam> {};

TEST_P(RealSizeGemm, RowsMatchTheDoubleReference) {
  const auto& [c, input, output] = GetParam();
  std::unique_ptr<Backend> device = gpu_test::backend_under_test(input);
  ASSERT_NE(device, nullptr);
  // Weights scaled by 1/sqrt(k) as trained layers are, so outputs are O(1).
  const std::vector<float> weight = kernel_check::rounded_to(
      kernel_check::uniform_floats(static_cast<size_t>(c.n * c.k), 51,
                                   static_cast<float>(std::sqrt(3.0 / static_cast<double>(c.k)))),
      input);
  DeviceMatrix dweight(*device, weight, input, c.n, c.k);
  for (int64_t m : {int64_t{1}, int64_t{37}, int64_t{256}}) {
    const std::vector<float> in = kernel_check::rounded_to(
        kernel_check::uniform_floats(static_cast<size_t>(m * c.k), 52), input);
    DeviceMatrix din(*device, in, input, m, c.k);
    DeviceMatrix dout = DeviceMatrix::poisoned(*device, output, m, c.n);
    const Status status = device->linear(din.view(), dweight.view(), dout.view());
    ASSERT_TRUE(status.ok()) << status.to_string();
    ASSERT_TRUE(device->synchronize().ok());
    const std::vector<float> all = dout.download();
    // The first and last rows against the double reference (a full row is n * k products).
    const std::vector<int64_t> rows =
        m == 1 ? std::vector<int64_t>{0} : std::vector<int64_t>{0, m - 1};
    std::vector<float> sampled;
    for (int64_t r : rows)
      sampled.insert(sampled.end(), all.begin() + r * c.n, all.begin() + (r + 1) * c.n);
    const double tolerance = output == DType::kF32 ? kFloat32GemmTolerance : kBf16OutputTolerance;
    expect_rows(
        kernel_check::row_errors(sampled,
                                 kernel_check::reference_linear(in, weight, c.n, c.k, rows),
                                 static_cast<int64_t>(rows.size()), c.n),
        tolerance,
        c.name + " m=" + std::to_string(m) + " " + dtype_label(input) + "->" + dtype_label(output));
    int64_t unwritten = 0;
    for (float value : all) unwritten += std::isnan(value) ? 1 : 0;
    EXPECT_EQ(unwritten, 0) << "elements never written";
  }
}

const GemmCase kGemmCases[] = {
    {"k12288_n24576", 24576, 12288}, {"qwen3_8b_qkv", 6144, 4096},
    {"qwen3_8b_o", 4096, 4096},      {"qwen3_8b_gate_up", 24576, 4096},
    {"qwen3_8b_down", 4096, 12288},  {"qwen3_8b_lm_head", 151936, 4096},
};

std::string gemm_name(const ::testing::TestParamInfo<GemmParam>& info) {
  const auto& [c, input, output] = info.param;
  return c.name + "_" + dtype_label(input) + "_to_" + dtype_label(output) +
         (input == DType::kBF16 ? "_Cuda" : "");
}

INSTANTIATE_TEST_SUITE_P(Shapes, RealSizeGemm,
                         ::testing::Combine(::testing::ValuesIn(kGemmCases),
                                            ::testing::Values(DType::kBF16),
                                            ::testing::Values(DType::kBF16, DType::kF32)),
                         gemm_name);
INSTANTIATE_TEST_SUITE_P(StrictShapes, RealSizeGemm,
                         ::testing::Combine(::testing::ValuesIn(kGemmCases),
                                            ::testing::Values(DType::kF32),
                                            ::testing::Values(DType::kF32)),
                         gemm_name);

// ---- a model in strict float32 --------------------------------------------------------------

std::filesystem::path write_model(const std::string& tag, int layers) {
  return gpu_test::write_test_model("configs/models/qwen3-0.6b/config.json", tag, layers, 5);
}

// Two layers of the 0.6B shape: a 200-token prompt then 24 decode steps, teacher-forced with
// the CPU's tokens; logits rows within 1e-4 of the CPU's, the same greedy token at every step
// (a step where the CPU's top-2 margin is under 1e-3 may differ: a tie at float32 precision).
TEST(StrictFloat32, SyntheticModelMatchesTheCpuBackend) {
  const std::filesystem::path dir = write_model("strict-model", 2);
  Checkpoint checkpoint = Checkpoint::open(dir).value();
  std::unique_ptr<Backend> device = gpu_test::backend_under_test(DType::kF32);
  std::unique_ptr<Backend> cpu = gpu_test::cpu_reference();
  ASSERT_NE(device, nullptr);
  ForwardLimits limits;
  limits.max_num_tokens = 256;
  limits.max_num_seqs = 1;
  limits.max_model_len = 512;
  gpu_test::PlacedModel on_device =
      gpu_test::place_model(*device, checkpoint, DType::kF32, DType::kF32, limits, 40, 16);
  gpu_test::PlacedModel on_cpu =
      gpu_test::place_model(*cpu, checkpoint, DType::kF32, DType::kF32, limits, 40, 16);
  EXPECT_EQ(on_device.model->weight_dtype(), DType::kF32);
  const ModelConfig& config = on_cpu.model->config();
  std::vector<int32_t> table(32);
  std::iota(table.begin(), table.end(), 3);
  std::vector<int32_t> input(200);
  std::mt19937 rng(9);
  for (int32_t& id : input) id = static_cast<int32_t>(rng() % config.vocab_size);
  const size_t vocab = static_cast<size_t>(config.vocab_size);
  std::vector<float> device_logits(vocab), cpu_logits(vocab);
  int cached = 0;
  double worst = 0.0;
  for (int step = 0; step <= 24; ++step) {
    const SequenceSlice slice{input, cached, table};
    ASSERT_TRUE(on_cpu.model->forward({&slice, 1}, on_cpu.cache, on_cpu.context, cpu_logits).ok());
    const Status status =
        on_device.model->forward({&slice, 1}, on_device.cache, on_device.context, device_logits);
    ASSERT_TRUE(status.ok()) << status.to_string();
    const RowErrors errors =
        kernel_check::row_errors(device_logits, cpu_logits, 1, config.vocab_size);
    EXPECT_TRUE(errors.within(1e-4)) << "step " << step << ": " << errors.describe();
    worst = std::max(worst, errors.worst);
    std::vector<size_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                      [&](size_t a, size_t b) { return cpu_logits[a] > cpu_logits[b]; });
    const size_t device_top = static_cast<size_t>(
        std::max_element(device_logits.begin(), device_logits.end()) - device_logits.begin());
    if (cpu_logits[order[0]] - cpu_logits[order[1]] >= 1e-3f) {
      EXPECT_EQ(device_top, order[0]) << "step " << step;
    }
    cached += static_cast<int>(input.size());
    input = {static_cast<int32_t>(order[0])};
  }
  std::printf("  strict float32 logits vs the CPU backend: worst row error %.3g over 25 steps\n",
              worst);
  std::filesystem::remove_all(dir);
}

#ifdef PDSERVE_WITH_CUDA
// Decode steps replayed from CUDA graphs (3 sequences padded to a bucket of 4) against eager
// steps of the same model, in strict float32 and in bf16: the graphs' split-K plan is the
// one of max_model_len, the eager one that of the step, so the rows agree to rounding.
class CudaGraphReplay : public ::testing::TestWithParam<DType> {};

TEST_P(CudaGraphReplay, ReplayedStepsMatchEagerStepsCuda) {
  PDS_REQUIRE_CUDA();
  const DType activation = GetParam();
  const std::filesystem::path dir = write_model("graph-replay", 2);
  Checkpoint checkpoint = Checkpoint::open(dir).value();
  std::unique_ptr<Backend> device = gpu_test::backend_under_test(activation);
  std::unique_ptr<Qwen3Model> model =
      std::move(Qwen3Model::create(*device, load_qwen3_weights(checkpoint, activation).value()))
          .value();
  const ModelConfig& config = model->config();
  ForwardLimits limits;
  limits.max_num_tokens = 128;
  limits.max_num_seqs = 8;
  limits.max_model_len = 2048;
  constexpr int kBlockSize = 16;
  constexpr int kBlocks = 3 * 128 + 1;
  ForwardContext eager_context =
      ForwardContext::create(*device, config, limits, kBlockSize).value();
  ForwardContext graph_context =
      ForwardContext::create(*device, config, limits, kBlockSize).value();
  KvCache eager_cache =
      KvCache::create(*device, kv_layout_for(config, kBlocks, kBlockSize, activation)).value();
  KvCache graph_cache =
      KvCache::create(*device, kv_layout_for(config, kBlocks, kBlockSize, activation)).value();
  std::unique_ptr<DecodeGraphRunner> runner =
      std::move(DecodeGraphRunner::create(*device, *model, graph_cache, graph_context, kBlocks - 1))
          .value();
  std::vector<std::vector<int32_t>> tables(3, std::vector<int32_t>(128));
  for (int s = 0; s < 3; ++s) std::iota(tables[s].begin(), tables[s].end(), s * 128);
  std::mt19937 rng(3);
  std::vector<std::vector<int32_t>> prompts(3);
  const int lengths[3] = {100, 17, 1000};
  const size_t vocab = static_cast<size_t>(config.vocab_size);
  std::vector<float> eager(3 * vocab), graph(3 * vocab);
  std::vector<int> cached(3, 0);
  for (int s = 0; s < 3; ++s) {  // prefill one by one (the 1000-token prompt in chunks)
    for (int i = 0; i < lengths[s]; ++i) prompts[s].push_back(static_cast<int32_t>(rng() % 150000));
    for (int done = 0; done < lengths[s]; done += 128) {
      const int count = std::min(128, lengths[s] - done);
      const SequenceSlice slice{std::span<const int32_t>(prompts[s]).subspan(done, count), done,
                                tables[s]};
      ASSERT_TRUE(model->forward({&slice, 1}, eager_cache, eager_context, eager).ok());
      ASSERT_TRUE(runner->forward({&slice, 1}, graph).ok());
    }
    cached[s] = lengths[s];
  }
  const double tolerance = activation == DType::kF32 ? 1e-5 : 2e-2;
  gpu_test::decode_eager_and_replayed(
      *model, eager_cache, eager_context, *runner, tables, cached, 6, eager, graph, [&](int step) {
        expect_rows(kernel_check::row_errors(graph, eager, 3, config.vocab_size), tolerance,
                    "decode step " + std::to_string(step) + " replayed vs eager, " +
                        dtype_label(activation));
      });
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaGraphReplay, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& param_info) {
                           return dtype_label(param_info.param);
                         });
#endif

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  return pdserve::gpu_test::run_main(argc, argv);
}
