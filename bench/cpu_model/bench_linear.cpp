// pdserve-bench-linear: the CPU linear layer (bf16 or FP8 weights, float32 activations) at
// several batch sizes and thread counts, for each instruction-set level this CPU runs, as
// weight bandwidth and GFLOP/s. With several weight types each point times them one after
// the other (A B A B over the points), so a loaded machine skews their ratio less.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "common/core/cli.h"
#include "kernels/linear_cpu.h"

namespace {

// A weight matrix of every element 1.0: bf16 bits, or FP8 E4M3 codes with 128 x 128 block
// scales of 1.0 (Qwen's FP8 layout).
struct BenchWeights {
  pdserve::DType dtype;
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> fp8;
  std::vector<float> scales;

  BenchWeights(pdserve::DType type, int64_t n, int64_t k) : dtype(type) {
    if (dtype == pdserve::DType::kBF16) {
      bf16.assign(static_cast<size_t>(n * k), 0x3f80);
    } else {
      fp8.assign(static_cast<size_t>(n * k), 0x38);
      scales.assign(static_cast<size_t>((n + 127) / 128 * ((k + 127) / 128)), 1.0f);
    }
  }
  const char* name() const { return dtype == pdserve::DType::kBF16 ? "bf16" : "fp8"; }
  size_t bytes() const { return dtype == pdserve::DType::kBF16 ? bf16.size() * 2 : fp8.size(); }
  pdserve::LinearProblem problem(const float* x, float* y, int64_t m, int64_t n, int64_t k) const {
    pdserve::LinearProblem p{x, k, nullptr, dtype, k, y, n, m, n, k};
    if (dtype == pdserve::DType::kBF16) {
      p.w = bf16.data();
    } else {
      p.w = fp8.data();
      p.w_scale = scales.data();
      p.scale_block_n = 128;
      p.scale_block_k = 128;
    }
    return p;
  }
};

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 12288;
  int64_t k = 1024;
  int repeats = 5;
  std::string isa_name = "all";
  std::vector<std::string> weight_names{"bf16"};
  std::vector<int64_t> rows{1, 8, 64, 512};
  CLI::App app{"pdserve-bench-linear: CPU linear layer throughput (y = x W^T, W [n, k])"};
  app.add_option("-n", n, "Output features (weight rows)")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("-k", k, "Input features")->capture_default_str()->check(CLI::Range(1, 1 << 16));
  app.add_option("--repeats", repeats, "Timed repeats per point (the largest batch: one)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--isa", isa_name, "Instruction-set level (portable, avx2, avx512, avx512_bf16) or all")
      ->capture_default_str();
  app.add_option("--weights", weight_names,
                 "Weight types, timed alternately per point: bf16, fp8 (E4M3, 128x128 scales)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "fp8"}));
  app.add_option("--rows", rows, "Activation rows (batch sizes) to time")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  std::vector<pdserve::CpuIsa> levels = pdserve::supported_cpu_isas();
  if (isa_name != "all") {
    pdserve::Result<pdserve::CpuIsa> parsed = pdserve::parse_cpu_isa(isa_name);
    if (!parsed.ok()) return pdserve::report_cli_error(parsed.status());
    pdserve::Result<pdserve::CpuIsa> level = pdserve::resolve_cpu_isa(*parsed);
    if (!level.ok()) return pdserve::report_cli_error(level.status());
    levels = {*level};
  }

  std::vector<BenchWeights> weights;
  for (const std::string& name : weight_names) {
    weights.emplace_back(name == "bf16" ? pdserve::DType::kBF16 : pdserve::DType::kF8E4M3, n, k);
  }
  int64_t max_m = 1;
  for (int64_t m : rows) max_m = std::max(max_m, m);
  std::vector<float> x(static_cast<size_t>(max_m * k), 0.5f), y(static_cast<size_t>(max_m * n));
  const int cores = omp_get_num_procs();
  std::printf(
      "| level | threads | m | weights | ms | weight GB/s | GFLOP/s |\n| --- | --- | --- | --- | "
      "--- | --- | --- |\n");
  for (pdserve::CpuIsa isa : levels) {
    for (int threads : {1, cores}) {
      pdserve::CpuThreadPool pool(threads);
      for (int64_t m : rows) {
        for (const BenchWeights& w : weights) {
          const pdserve::LinearProblem p = w.problem(x.data(), y.data(), m, n, k);
          if (!pdserve::linear_cpu(p, pool, isa).ok()) return 1;
          const int runs = m == max_m ? 1 : repeats;
          const auto start = std::chrono::steady_clock::now();
          for (int r = 0; r < runs; ++r) (void)pdserve::linear_cpu(p, pool, isa);
          const double seconds =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
              runs;
          std::printf("| %s | %d | %lld | %s | %.2f | %.1f | %.1f |\n",
                      std::string(pdserve::cpu_isa_name(isa)).c_str(), threads,
                      static_cast<long long>(m), w.name(), seconds * 1e3,
                      static_cast<double>(w.bytes()) / seconds / 1e9,
                      2.0 * static_cast<double>(m * n * k) / seconds / 1e9);
        }
      }
      if (cores == 1) break;
    }
  }
  return 0;
}
