// pdserve-bench-linear: the CPU linear layer (bf16 weights, float32 activations) at several
// batch sizes and thread counts, as weight bandwidth and GFLOP/s.
#include <chrono>
#include <cstdio>
#include <vector>

#include "common/core/cli.h"
#include "kernels/linear_cpu.h"

int main(int argc, char** argv) {
  int64_t n = 12288;
  int64_t k = 1024;
  int repeats = 5;
  CLI::App app{"pdserve-bench-linear: CPU linear layer throughput (y = x W^T, W bf16 [n, k])"};
  app.add_option("-n", n, "Output features (weight rows)")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("-k", k, "Input features")->capture_default_str()->check(CLI::Range(1, 1 << 16));
  app.add_option("--repeats", repeats, "Timed repeats per point")->capture_default_str()->check(CLI::Range(1, 1000));
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;

  std::vector<uint16_t> w(static_cast<size_t>(n * k), 0x3c00);  // 1.0 in bf16
  std::vector<float> x(static_cast<size_t>(64 * k), 0.5f), y(static_cast<size_t>(64 * n));
  std::printf("| threads | m | ms | weight GB/s | GFLOP/s |\n| --- | --- | --- | --- | --- |\n");
  for (int threads : {1, 2}) {
    for (int64_t m : {1, 8, 64}) {
      pdserve::LinearProblem p{x.data(), k, w.data(), pdserve::DType::kBF16, k, y.data(), n, m, n, k};
      if (!pdserve::linear_cpu(p, threads).ok()) return 1;
      const auto start = std::chrono::steady_clock::now();
      for (int r = 0; r < repeats; ++r) (void)pdserve::linear_cpu(p, threads);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / repeats;
      std::printf("| %d | %lld | %.2f | %.1f | %.1f |\n", threads, static_cast<long long>(m), seconds * 1e3,
                  static_cast<double>(n * k * 2) / seconds / 1e9, 2.0 * static_cast<double>(m * n * k) / seconds / 1e9);
    }
  }
  return 0;
}
