// pdserve-bench-load: how fast load_qwen3_weights makes host weights from a checkpoint, held
// against this machine's memcpy bandwidth. Synthetic checkpoints (Qwen3-0.6B shape, and the
// 8B shape cut to 4 layers) are generated on first use.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/core/cli.h"
#include "common/model/checkpoint.h"
#include "common/model/host_buffer.h"
#include "common/model/parallel_for.h"
#include "common/model/qwen3_weights.h"
#include "common/model/synthetic_checkpoint.h"

namespace {

namespace fs = std::filesystem;
using pdserve::Checkpoint;
using pdserve::DType;
using pdserve::HostTensor;
using pdserve::Qwen3Weights;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Best-of-`repeats` bandwidth of copying `bytes` with `threads` threads, in GB/s of bytes copied.
double memcpy_bandwidth(size_t bytes, unsigned threads, int repeats) {
  std::unique_ptr<std::byte[]> src(new std::byte[bytes]);
  std::unique_ptr<std::byte[]> dst(new std::byte[bytes]);
  std::memset(src.get(), 1, bytes);
  std::memset(dst.get(), 2, bytes);
  const size_t grain = (bytes + threads - 1) / threads;
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    auto start = Clock::now();
    pdserve::parallel_for(
        bytes, grain,
        [&](size_t begin, size_t end) {
          std::memcpy(dst.get() + begin, src.get() + begin, end - begin);
        },
        threads);
    best = std::max(best, static_cast<double>(bytes) / seconds_since(start) / 1e9);
  }
  return best;
}

// GB/s of writing `bytes` into freshly allocated memory (the loader's conversion buffers):
// bounded by page faults and the kernel zeroing new pages, not by memcpy.
double first_touch_bandwidth(size_t bytes) {
  std::shared_ptr<std::byte[]> buffer = pdserve::allocate_host_buffer(bytes);
  auto start = Clock::now();
  pdserve::parallel_for(bytes, size_t{64} << 20, [&](size_t begin, size_t end) {
    std::memset(buffer.get() + begin, 3, end - begin);
  });
  return static_cast<double>(bytes) / seconds_since(start) / 1e9;
}

// Reads every byte of every tensor (as the upload to a device would), so mmap page faults and
// disk reads are paid. Returns a checksum to keep the reads alive.
uint64_t touch_all(const std::vector<const HostTensor*>& tensors) {
  std::atomic<uint64_t> checksum{0};
  for (const HostTensor* tensor : tensors) {
    const size_t words = tensor->nbytes() / sizeof(uint64_t);
    pdserve::parallel_for(words, size_t{1} << 20, [&](size_t begin, size_t end) {
      uint64_t sum = 0;
      for (size_t i = begin; i < end; ++i) {
        uint64_t word;
        std::memcpy(&word, tensor->data + i * sizeof(uint64_t), sizeof(word));
        sum += word;
      }
      checksum += sum;
    });
  }
  return checksum;
}

std::vector<const HostTensor*> all_tensors(const Qwen3Weights& weights) {
  std::vector<const HostTensor*> tensors = {&weights.embed_tokens, &weights.final_norm};
  if (!weights.config.tie_word_embeddings) tensors.push_back(&weights.lm_head);
  for (const pdserve::Qwen3LayerWeights& l : weights.layers) {
    for (const HostTensor* t :
         {&l.input_layernorm, &l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.q_norm, &l.k_norm,
          &l.post_attention_layernorm, &l.gate_proj, &l.up_proj, &l.down_proj}) {
      tensors.push_back(t);
    }
  }
  return tensors;
}

// Drops the checkpoint's weight files from the page cache so the next load reads the disk.
bool drop_from_page_cache(const fs::path& dir) {
  bool all = true;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ::fdatasync(fd);  // dirty pages cannot be dropped
    all &= ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
    ::close(fd);
  }
  return all;
}

struct Shape {
  const char* label;
  const char* config_folder;
  std::optional<int> layers;
};

int run_shape(const Shape& shape, const fs::path& work_dir, bool cold, double memcpy_gbps) {
  const fs::path dir = work_dir / shape.label;
  if (!Checkpoint::open(dir).ok()) {
    pdserve::SyntheticCheckpointOptions options;
    options.config_path = fs::path(PDSERVE_ASSETS_DIR) / shape.config_folder / "config.json";
    options.out_dir = dir;
    options.seed = 1;
    options.num_layers = shape.layers;
    options.dtype = DType::kBF16;
    options.tokenizer_dir = fs::path(PDSERVE_ASSETS_DIR) / "qwen3-tokenizer";
    auto start = Clock::now();
    auto written = pdserve::write_synthetic_checkpoint(options);
    if (!written.ok()) return pdserve::report_cli_error(written.status());
    std::printf("%s: generated %.3f GB in %.1f s\n", shape.label, written->weight_bytes / 1e9,
                seconds_since(start));
  }
  struct Case {
    DType dtype;
    bool cold;
  };
  std::vector<Case> cases = {{DType::kBF16, false}, {DType::kF32, false}};
  if (cold) {
    cases.push_back({DType::kBF16, true});
    cases.push_back({DType::kF32, true});
  }
  for (const Case& c : cases) {
    if (c.cold && !drop_from_page_cache(dir)) {
      std::printf("%s: cannot drop the page cache (posix_fadvise); skipping cold runs\n",
                  shape.label);
      continue;
    }
    auto start = Clock::now();
    auto checkpoint = Checkpoint::open(dir);
    if (!checkpoint.ok()) return pdserve::report_cli_error(checkpoint.status());
    double open_s = seconds_since(start);
    auto weights = pdserve::load_qwen3_weights(*checkpoint, c.dtype);
    if (!weights.ok()) return pdserve::report_cli_error(weights.status());
    double load_s = seconds_since(start);
    uint64_t checksum = touch_all(all_tensors(*weights));
    double touched_s = seconds_since(start);
    double file_gb = 0, host_gb = 0;
    for (const HostTensor* t : all_tensors(*weights)) {
      host_gb += t->nbytes() / 1e9;
      file_gb += t->nbytes() / 1e9 * 2 / pdserve::dtype_size(c.dtype);  // files are bf16
    }
    std::printf(
        "%-12s %-8s %-5s open %6.3f s | load %6.3f s = %6.2f GB/s of file | load+read %6.3f s = "
        "%6.2f GB/s (%.0f%% of memcpy) | %.2f GB host [%llx]\n",
        shape.label, std::string(pdserve::dtype_name(c.dtype)).c_str(), c.cold ? "cold" : "warm",
        open_s, load_s, file_gb / load_s, touched_s, file_gb / touched_s,
        100.0 * (file_gb / touched_s) / memcpy_gbps, host_gb,
        static_cast<unsigned long long>(checksum & 0xffff));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Measures load_qwen3_weights on synthetic Qwen3 checkpoints (0.6B shape, 8B shape "
      "with 4 layers) against this machine's memcpy bandwidth."};
  std::string work_dir = std::string(PDSERVE_BINARY_DIR) + "/bench-load-models";
  bool cold = false;
  bool keep = false;
  bool skip_8b = false;
  app.add_option("--work-dir", work_dir, "Where the synthetic checkpoints are generated")
      ->capture_default_str();
  app.add_flag("--cold", cold, "Also measure with the files dropped from the page cache");
  app.add_flag("--keep", keep, "Keep the generated checkpoints (default: delete them at the end)");
  app.add_flag("--skip-8b", skip_8b, "Only the 0.6B shape (the 8B-4-layer one needs ~12 GB RAM)");
  if (int exit_code = pdserve::parse_cli(app, argc, argv); exit_code >= 0) return exit_code;

  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  double memcpy_1 = memcpy_bandwidth(size_t{1} << 30, 1, 5);
  double memcpy_n = memcpy_bandwidth(size_t{1} << 30, threads, 5);
  double first_touch = first_touch_bandwidth(size_t{1} << 30);
  std::printf(
      "memcpy 1 GiB: %.2f GB/s (1 thread), %.2f GB/s (%u threads); first write to fresh memory: "
      "%.2f GB/s\n",
      memcpy_1, memcpy_n, threads, first_touch);

  std::vector<Shape> shapes = {{"qwen3-0.6b", "qwen3-0.6b", std::nullopt}};
  if (!skip_8b) shapes.push_back({"qwen3-8b-4l", "qwen3-8b", 4});
  for (const Shape& shape : shapes) {
    if (int rc = run_shape(shape, work_dir, cold, memcpy_n); rc != 0) return rc;
  }
  if (!keep) {
    std::error_code ec;
    fs::remove_all(work_dir, ec);
  }
  return 0;
}
