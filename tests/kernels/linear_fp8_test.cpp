// The CPU linear layer with FP8 (E4M3) weights at every instruction-set level: against a
// float64 product of the dequantized weights (code x block scale), the portable order that the
// avx2 kernel reproduces bit for bit, results independent of batch and threads (also across the
// switch to decoding each column block once for prefill-sized batches), NaN codes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/core/dtype.h"
#include "common/core/float8.h"
#include "common/model/fp8_quantizer.h"
#include "kernels/backend.h"
#include "kernels/cpu_backend.h"
#include "kernels/linear_cpu.h"
#include "kernels/model/model_loader.h"

namespace pdserve {
namespace {

std::vector<float> random_floats(size_t count, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> values(count);
  for (float& v : values) v = dist(rng);
  return values;
}

// An n x k FP8 weight with scales per block_n x block_k (block_k >= k: per row block).
struct Fp8Weight {
  int64_t n = 0, k = 0, block_n = 0, block_k = 0;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  int64_t scale_cols() const { return (k + block_k - 1) / block_k; }
  double value(int64_t i, int64_t j) const {
    return double{fp8_e4m3_to_float(codes[i * k + j])} *
           scales[(i / block_n) * scale_cols() + j / block_k];
  }
  MatrixView view() {
    MatrixView v = MatrixView::dense(codes.data(), DType::kF8E4M3, n, k);
    v.scale = scales.data();
    v.scale_block_n = block_n;
    v.scale_block_k = block_k;
    return v;
  }
};

// Quantized from N(0, 0.05^2) weights as a checkpoint writer does (scales rounded to bf16);
// per-row-block scales when block_n < n and block_k >= k cover per-channel / per-tensor.
Fp8Weight make_fp8(int64_t n, int64_t k, int64_t block_n, int64_t block_k, uint32_t seed) {
  Fp8Weight w{n, k, block_n, block_k, {}, {}};
  std::vector<float> values = random_floats(static_cast<size_t>(n * k), seed, 0.05f);
  w.codes.resize(values.size());
  w.scales.resize(static_cast<size_t>((n + block_n - 1) / block_n * w.scale_cols()));
  for (int64_t row = 0; row < n; row += block_n) {
    const int64_t rows = std::min(block_n, n - row);
    quantize_fp8_stripe(values.data() + row * k, rows, k, block_k, DType::kBF16,
                        w.codes.data() + row * k, w.scales.data() + row / block_n * w.scale_cols());
  }
  return w;
}

std::string level_name(const ::testing::TestParamInfo<CpuIsa>& info) {
  return std::string(cpu_isa_name(info.param));
}

class LinearFp8 : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    BackendOptions options;
    options.device = DeviceKind::kCpu;
    options.cpu_isa = GetParam();
    backend_ = std::move(create_backend(options)).value();
  }
  std::unique_ptr<Backend> backend_;
};

float round_bf16(float value) {
  return bf16_to_float(float_to_bf16(value));
}

TEST_P(LinearFp8, MatchesFloat64ProductOfTheDequantizedWeights) {
  struct Shape {
    int64_t m, n, k, block_n, block_k;
  };
  // 128x128 blocks (partial ones at the edges), per tensor (block = n x k), per channel
  // (1 x k), k below one block and not a multiple of 8, 16 or 32.
  for (Shape s :
       {Shape{1, 97, 256, 128, 128}, Shape{5, 130, 300, 128, 128}, Shape{7, 260, 1024, 128, 128},
        Shape{2, 33, 40, 128, 128}, Shape{3, 50, 77, 50, 77}, Shape{4, 64, 200, 1, 200},
        Shape{9, 300, 1000, 128, 128}}) {
    Fp8Weight w = make_fp8(s.n, s.k, s.block_n, s.block_k, 31);
    std::vector<float> x = random_floats(static_cast<size_t>(s.m * s.k), 32, 1.0f);
    std::vector<float> y(static_cast<size_t>(s.m * s.n), std::numeric_limits<float>::quiet_NaN());
    ASSERT_TRUE(backend_
                    ->linear(MatrixView::dense(x.data(), DType::kF32, s.m, s.k), w.view(),
                             MatrixView::dense(y.data(), DType::kF32, s.m, s.n))
                    .ok());
    // avx512_bf16 rounds the activations to bf16 (the weights are exact in bf16).
    const bool rounded = GetParam() == CpuIsa::kAvx512Bf16;
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        double sum = 0, magnitude = 0;
        for (int64_t kk = 0; kk < s.k; ++kk) {
          const float xv = x[i * s.k + kk];
          const double product = double{rounded ? round_bf16(xv) : xv} * w.value(j, kk);
          sum += product;
          magnitude += std::fabs(product);
        }
        // float32 accumulation: about sqrt(k) roundings of the sum of magnitudes.
        ASSERT_NEAR(y[i * s.n + j], sum, 2e-7 * std::sqrt(double(s.k)) * magnitude + 1e-30)
            << "m " << s.m << " n " << s.n << " k " << s.k << " at " << i << "," << j;
      }
    }
  }
}

TEST_P(LinearFp8, RowsAreBitwiseIndependentOfBatchAndThreads) {
  const int64_t m = 9, n = 300, k = 1000;
  Fp8Weight w = make_fp8(n, k, 128, 128, 41);
  std::vector<float> x = random_floats(static_cast<size_t>(m * k), 42, 1.0f);
  std::vector<float> batched(static_cast<size_t>(m * n));
  LinearProblem p{
      x.data(), k,  w.codes.data(), DType::kF8E4M3, k, batched.data(), n, m, n, k, w.scales.data(),
      128,      128};
  CpuThreadPool one_thread(1), two_threads(2);
  ASSERT_TRUE(linear_cpu(p, two_threads, GetParam()).ok());
  for (int64_t i = 0; i < m; ++i) {
    std::vector<float> single(static_cast<size_t>(n));
    LinearProblem one = p;
    one.x = x.data() + i * k;
    one.y = single.data();
    one.m = 1;
    ASSERT_TRUE(linear_cpu(one, one_thread, GetParam()).ok());
    for (int64_t j = 0; j < n; ++j) ASSERT_EQ(single[j], batched[i * n + j]) << i << "," << j;
  }
  if (GetParam() == CpuIsa::kPortable || GetParam() == CpuIsa::kAvx2) {
    // The portable kernel is the specification of the avx2 kernel's order.
    std::vector<float> portable(static_cast<size_t>(m * n));
    LinearProblem q = p;
    q.y = portable.data();
    linear_cpu_fp8_columns_portable(q, 0, n);
    EXPECT_EQ(portable, batched);
  }
}

// float64 sum of x_i . w_j over the dequantized weights (x rounded to bf16 at avx512_bf16),
// and the sum of the products' magnitudes for the float32 rounding bound.
struct Float64Dot {
  double sum = 0, magnitude = 0;
};
Float64Dot float64_dot(const float* x, const Fp8Weight& w, int64_t j, bool round_x) {
  Float64Dot dot;
  for (int64_t kk = 0; kk < w.k; ++kk) {
    const double product = double{round_x ? round_bf16(x[kk]) : x[kk]} * w.value(j, kk);
    dot.sum += product;
    dot.magnitude += std::fabs(product);
  }
  return dot;
}

// Batches from kFp8DecodeOnceMinRows rows on decode each column block once into a per-thread
// buffer; below it every row tile decodes the codes itself. Rows just below, at and above the
// switch and a prefill chunk, odd n and k (column and k tails, partial scale blocks), per
// tensor and per channel scales, strided activations and outputs, on two threads: every row
// equals the same row computed alone (the in-register path) bit for bit, and the float64
// product of the dequantized weights within float32 rounding. The buffers grow and are reused
// from shape to shape.
TEST_P(LinearFp8, PrefillBatchesDecodedOnceEqualLoneRowsBitwise) {
  struct Shape {
    int64_t m, n, k, block_n, block_k;
  };
  const int64_t at = kFp8DecodeOnceMinRows;
  for (Shape s : {Shape{at - 1, 130, 300, 128, 128}, Shape{at, 130, 300, 128, 128},
                  Shape{at + 1, 257, 1000, 128, 128}, Shape{67, 130, 77, 130, 77},
                  Shape{at + 3, 61, 200, 1, 200}, Shape{130, 389, 1100, 128, 128},
                  Shape{at, 40, 40, 128, 128}}) {
    Fp8Weight w = make_fp8(s.n, s.k, s.block_n, s.block_k, 71);
    const int64_t x_stride = s.k + 3, y_stride = s.n + 5;
    std::vector<float> x = random_floats(static_cast<size_t>(s.m * x_stride), 72, 1.0f);
    std::vector<float> batched(static_cast<size_t>(s.m * y_stride),
                               std::numeric_limits<float>::quiet_NaN());
    LinearProblem p{x.data(),
                    x_stride,
                    w.codes.data(),
                    DType::kF8E4M3,
                    s.k,
                    batched.data(),
                    y_stride,
                    s.m,
                    s.n,
                    s.k,
                    w.scales.data(),
                    s.block_n,
                    s.block_k};
    CpuThreadPool one_thread(1), two_threads(2);
    ASSERT_TRUE(linear_cpu(p, two_threads, GetParam()).ok());
    const bool rounded = GetParam() == CpuIsa::kAvx512Bf16;
    std::vector<float> alone(static_cast<size_t>(s.n));
    for (int64_t i = 0; i < s.m; ++i) {
      LinearProblem one = p;
      one.x = x.data() + i * x_stride;
      one.y = alone.data();
      one.m = 1;
      ASSERT_TRUE(linear_cpu(one, one_thread, GetParam()).ok());
      for (int64_t j = 0; j < s.n; ++j) {
        const float y = batched[i * y_stride + j];
        ASSERT_EQ(alone[j], y) << "m " << s.m << " n " << s.n << " k " << s.k << " at " << i << ","
                               << j;
        const Float64Dot dot = float64_dot(x.data() + i * x_stride, w, j, rounded);
        ASSERT_NEAR(y, dot.sum, 2e-7 * std::sqrt(double(s.k)) * dot.magnitude + 1e-30)
            << "m " << s.m << " n " << s.n << " k " << s.k << " at " << i << "," << j;
      }
      for (int64_t j = s.n; j < y_stride; ++j) {
        ASSERT_TRUE(std::isnan(batched[i * y_stride + j])) << "wrote past column " << s.n;
      }
    }
  }
}

// Every finite code, in every lane of a 64-code load (the avx512_bf16 kernel widens even and
// odd positions apart) and in both of its widenings: the shift for loads of normal codes only,
// the exact lookup for loads holding a zero, subnormal or smallest-exponent code. Columns mix
// all codes, hold only normal ones, or one of the looked-up codes among normal ones; k has a
// partial last block and a partial last load. One row, a small batch and a batch that widens
// each column block once: float64 within float32 rounding, and bit for bit the same per row.
TEST_P(LinearFp8, EveryCodeInEveryLaneMatchesFloat64) {
  std::vector<uint8_t> finite, normal, looked_up;
  for (int code = 0; code < 256; ++code) {
    const int magnitude = code & 0x7F;
    if (magnitude == 0x7F) continue;  // NaN: NanCodesGiveNan*
    finite.push_back(static_cast<uint8_t>(code));
    (magnitude < 15 ? looked_up : normal).push_back(static_cast<uint8_t>(code));
  }
  const int64_t k = 300, block = 128;
  const int64_t mixed = 254, only_normal = 254;
  const int64_t n = mixed + only_normal + static_cast<int64_t>(looked_up.size());
  Fp8Weight w{n, k, block, block, std::vector<uint8_t>(static_cast<size_t>(n * k)), {}};
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t kk = 0; kk < k; ++kk) {
      uint8_t& code = w.codes[j * k + kk];
      if (j < mixed) {
        code = finite[(j * 7 + kk) % finite.size()];
      } else {
        code = normal[(j * 5 + kk) % normal.size()];
        const int64_t lone = j - mixed - only_normal;
        if (lone >= 0 && kk == (lone * 37) % k) code = looked_up[lone];
      }
    }
  }
  for (int64_t b = 0; b < (n + block - 1) / block * w.scale_cols(); ++b) {
    w.scales.push_back(std::ldexp(1.0f + 0.125f * static_cast<float>(b % 5), -static_cast<int>(b % 7)));
  }
  const bool rounded = GetParam() == CpuIsa::kAvx512Bf16;
  const int64_t rows = kFp8DecodeOnceMinRows + 1;
  std::vector<float> x = random_floats(static_cast<size_t>(rows * k), 91, 1.0f);
  const auto product = [&](float* x_rows, int64_t m, float* y) {
    return backend_->linear(MatrixView::dense(x_rows, DType::kF32, m, k), w.view(),
                            MatrixView::dense(y, DType::kF32, m, n));
  };
  std::vector<float> alone(static_cast<size_t>(rows * n));
  for (int64_t i = 0; i < rows; ++i) {
    ASSERT_TRUE(product(x.data() + i * k, 1, alone.data() + i * n).ok());
    for (int64_t j = 0; j < n; ++j) {
      const Float64Dot dot = float64_dot(x.data() + i * k, w, j, rounded);
      ASSERT_NEAR(alone[i * n + j], dot.sum, 2e-7 * std::sqrt(double(k)) * dot.magnitude + 1e-30)
          << "row " << i << " column " << j << " code at 0: " << int{w.codes[j * k]};
    }
  }
  for (int64_t m : {int64_t{3}, rows}) {
    std::vector<float> batched(static_cast<size_t>(m * n));
    ASSERT_TRUE(product(x.data(), m, batched.data()).ok());
    for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(batched[i], alone[i]) << "m " << m << " at " << i;
  }
  if (GetParam() == CpuIsa::kAvx2) {  // its widening gives the portable kernel's floats
    std::vector<float> portable(static_cast<size_t>(rows * n));
    const LinearProblem p{x.data(), k,    w.codes.data(), DType::kF8E4M3, k,    portable.data(),
                          n,        rows, n,              k,              w.scales.data(), block,
                          block};
    linear_cpu_fp8_columns_portable(p, 0, n);
    EXPECT_EQ(portable, alone);
  }
}

TEST_P(LinearFp8, NanCodesGiveNanInEveryRowOfAPrefillBatch) {
  const int64_t m = kFp8DecodeOnceMinRows + 2, n = 7, k = 100;
  Fp8Weight w = make_fp8(n, k, 128, 128, 81);
  w.codes[2 * k + 99] = 0x7F;
  w.codes[5 * k + 3] = 0xFF;
  std::vector<float> x = random_floats(static_cast<size_t>(m * k), 82, 1.0f);
  std::vector<float> y(static_cast<size_t>(m * n));
  ASSERT_TRUE(backend_
                  ->linear(MatrixView::dense(x.data(), DType::kF32, m, k), w.view(),
                           MatrixView::dense(y.data(), DType::kF32, m, n))
                  .ok());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      EXPECT_EQ(std::isnan(y[i * n + j]), j == 2 || j == 5) << i << "," << j;
    }
  }
}

TEST_P(LinearFp8, NanCodesGiveNan) {
  Fp8Weight w = make_fp8(4, 64, 128, 128, 51);
  w.codes[1 * 64 + 10] = 0x7F;
  w.codes[3 * 64 + 63] = 0xFF;
  std::vector<float> x(64, 1.0f), y(4);
  ASSERT_TRUE(backend_
                  ->linear(MatrixView::dense(x.data(), DType::kF32, 1, 64), w.view(),
                           MatrixView::dense(y.data(), DType::kF32, 1, 4))
                  .ok());
  EXPECT_FALSE(std::isnan(y[0]));
  EXPECT_TRUE(std::isnan(y[1]));
  EXPECT_FALSE(std::isnan(y[2]));
  EXPECT_TRUE(std::isnan(y[3]));
}

TEST_P(LinearFp8, Fp8WeightsWithoutScalesAreRefused) {
  Fp8Weight w = make_fp8(4, 64, 128, 128, 61);
  MatrixView no_scale = w.view();
  no_scale.scale = nullptr;
  std::vector<float> x(64, 1.0f), y(4);
  EXPECT_EQ(backend_
                ->linear(MatrixView::dense(x.data(), DType::kF32, 1, 64), no_scale,
                         MatrixView::dense(y.data(), DType::kF32, 1, 4))
                .code(),
            StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Levels, LinearFp8, ::testing::ValuesIn(supported_cpu_isas()), level_name);

}  // namespace
}  // namespace pdserve
