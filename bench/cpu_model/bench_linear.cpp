// pdserve-bench-linear: the CPU linear layer (bf16 weights, float32 activations) at several
// batch sizes and thread counts, for each instruction-set level this CPU runs, as weight
// bandwidth and GFLOP/s.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "common/core/cli.h"
#include "kernels/linear_cpu.h"

int main(int argc, char** argv) {
  int64_t n = 12288;
  int64_t k = 1024;
  int repeats = 5;
  std::string isa_name = "all";
  CLI::App app{"pdserve-bench-linear: CPU linear layer throughput (y = x W^T, W bf16 [n, k])"};
  app.add_option("-n", n, "Output features (weight rows)")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("-k", k, "Input features")->capture_default_str()->check(CLI::Range(1, 1 << 16));
  app.add_option("--repeats", repeats, "Timed repeats per point")->capture_default_str()->check(CLI::Range(1, 1000));
  app.add_option("--isa", isa_name, "Instruction-set level (portable, avx2, avx512, avx512_bf16) or all")
      ->capture_default_str();
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  std::vector<pdserve::CpuIsa> levels = pdserve::supported_cpu_isas();
  if (isa_name != "all") {
    pdserve::Result<pdserve::CpuIsa> parsed = pdserve::parse_cpu_isa(isa_name);
    if (!parsed.ok()) return pdserve::report_cli_error(parsed.status());
    pdserve::Result<pdserve::CpuIsa> level = pdserve::resolve_cpu_isa(*parsed);
    if (!level.ok()) return pdserve::report_cli_error(level.status());
    levels = {*level};
  }

  std::vector<uint16_t> w(static_cast<size_t>(n * k), 0x3c00);  // 1.0 in bf16
  const int64_t max_m = 512;
  std::vector<float> x(static_cast<size_t>(max_m * k), 0.5f), y(static_cast<size_t>(max_m * n));
  const int cores = omp_get_num_procs();
  std::printf("| level | threads | m | ms | weight GB/s | GFLOP/s |\n| --- | --- | --- | --- | --- | --- |\n");
  for (pdserve::CpuIsa isa : levels) {
    for (int threads : {1, cores}) {
      pdserve::CpuThreadPool pool(threads);
      for (int64_t m : {int64_t{1}, int64_t{8}, int64_t{64}, max_m}) {
        pdserve::LinearProblem p{x.data(), k, w.data(), pdserve::DType::kBF16, k, y.data(), n, m, n, k};
        if (!pdserve::linear_cpu(p, pool, isa).ok()) return 1;
        const int runs = m == max_m ? 1 : repeats;
        const auto start = std::chrono::steady_clock::now();
        for (int r = 0; r < runs; ++r) (void)pdserve::linear_cpu(p, pool, isa);
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / runs;
        std::printf("| %s | %d | %lld | %.2f | %.1f | %.1f |\n", std::string(pdserve::cpu_isa_name(isa)).c_str(),
                    threads, static_cast<long long>(m), seconds * 1e3, static_cast<double>(n * k * 2) / seconds / 1e9,
                    2.0 * static_cast<double>(m * n * k) / seconds / 1e9);
      }
      if (cores == 1) break;
    }
  }
  return 0;
}
