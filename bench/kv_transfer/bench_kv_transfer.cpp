// pdserve-bench-kv-transfer: KV-transfer bandwidth of each path between two endpoints in one
// process (loopback), for a Qwen3 prompt's blocks in pools of that model's layout, against the
// limits measured in the same run (issue #14 item 4):
//   direct   two KvTransferServices (each with its transfer thread, as in a node), puts
//            straight from pool to pool (host pools, or GPU pools on a UCX that can address
//            CUDA memory), one put() per layer as the forward reports them.
//   staged   the staging path (kv_transfer_service.h): a sender service copying each layer's
//            runs out of its pool into its send ring and putting them from there into a
//            receiver service's landing area, then the landed blocks copied into the receiver's
//            pool (as UcxKvConnector does before an import is ready).
//   Both timed from open() to the acknowledged completion having reached both sides (and, for
//   staged, the last copy into the pool).
//   copy     the pool <-> pinned host copies alone (PoolCopier: cudaMemcpyAsync on a GPU,
//            memcpy on a host pool), to host and back, the same runs in one batch.
//   ucx_perftest  UCX's own ucp_put_bw between two processes on the same transport, at the
//            size of one layer's contiguous run of the prompt (the largest put the paths make).
// The pool is laid out K then V, [layers][blocks][...], so a prompt costs one put per (layer,
// K/V, run of blocks contiguous on both sides): contiguous block ids coalesce into 2 * layers
// puts, scattered ids into one put per block. --device cuda:N puts both pools on that GPU.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/core/cli.h"
#include "common/model/model_config.h"
#include "kernels/backend.h"
#include "kernels/model/kv_cache.h"
#include "kv_transfer/cuda_pool_copier.h"
#include "kv_transfer/host_pool_copier.h"
#include "kv_transfer/kv_transfer_service.h"

namespace pdserve {
namespace {

using kv_transfer::BlockCopy;
using kv_transfer::CopyDirection;
using kv_transfer::KvTransferService;
using kv_transfer::PoolCopier;
using kv_transfer::PoolCopy;
using Clock = std::chrono::steady_clock;

// The puts moving `source_blocks[i]` to `destination_blocks[i]` for every layer's K and V,
// merging neighbours that are consecutive in both pools; one list per layer (K runs, then V
// runs), as the connector sends them. `destination` is the receiving pool's layout.
std::vector<std::vector<BlockCopy>> layer_copies(const KvLayout& source,
                                                 const KvLayout& destination,
                                                 const std::vector<int>& source_blocks,
                                                 const std::vector<int>& destination_blocks) {
  const std::uint64_t block_bytes = source.layer_block_bytes();
  std::vector<std::vector<BlockCopy>> layers;
  for (int layer = 0; layer < source.num_layers; ++layer) {
    std::vector<BlockCopy>& copies = layers.emplace_back();
    for (bool value_half : {false, true}) {
      for (size_t i = 0; i < source_blocks.size(); ++i) {
        const bool extends_run = i > 0 && source_blocks[i] == source_blocks[i - 1] + 1 &&
                                 destination_blocks[i] == destination_blocks[i - 1] + 1;
        if (extends_run) {
          copies.back().bytes += block_bytes;
        } else {
          copies.push_back({source.offset(layer, source_blocks[i], value_half),
                            destination.offset(layer, destination_blocks[i], value_half),
                            block_bytes});
        }
      }
    }
  }
  return layers;
}

std::vector<BlockCopy> flatten(const std::vector<std::vector<BlockCopy>>& layers) {
  std::vector<BlockCopy> all;
  for (const auto& layer : layers) all.insert(all.end(), layer.begin(), layer.end());
  return all;
}

struct Timing {
  double best_ms = 0;
  double median_ms = 0;
};

Timing summarize(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return Timing{samples.front(), samples[samples.size() / 2]};
}

// Runs `once` (returning its milliseconds) `repeats` times after one warm-up.
Result<Timing> time_repeats(int repeats, const std::function<Result<double>(int)>& once) {
  std::vector<double> samples;
  for (int r = 0; r <= repeats; ++r) {
    PDS_ASSIGN_OR_RETURN(const double ms, once(r));
    if (r > 0) samples.push_back(ms);  // r == 0 warms up (first touch, UCX lazy set-up)
  }
  return summarize(std::move(samples));
}

// Polls a copier batch to completion (a minute at most).
Status wait_copy(PoolCopier& copier, kv_transfer::CopyBatchId batch) {
  const auto give_up = Clock::now() + std::chrono::minutes(1);
  for (;;) {
    PDS_ASSIGN_OR_RETURN(const bool done, copier.finished(batch));
    if (done) return Status::ok_status();
    if (Clock::now() > give_up) return deadline_exceeded("a pool copy took over a minute");
    std::this_thread::yield();
  }
}

// One endpoint's pool: host memory, or device memory of a CUDA backend, with its copier.
struct Pool {
  std::vector<std::uint8_t> host;
  DeviceBuffer device;
  std::shared_ptr<PoolCopier> copier;
  void* data() { return device.data() != nullptr ? device.data() : host.data(); }
  bool on_gpu() const { return device.data() != nullptr; }
};

Result<Pool> make_pool(Backend* gpu, std::size_t bytes, std::uint8_t fill) {
  Pool pool;
  if (gpu == nullptr) {
    pool.host.assign(bytes, fill);  // touched before registration: page faults are not timed
    pool.copier = std::make_shared<kv_transfer::HostPoolCopier>(
        reinterpret_cast<std::byte*>(pool.host.data()), bytes);
    return pool;
  }
  PDS_ASSIGN_OR_RETURN(pool.device, gpu->allocate(bytes));
  PDS_ASSIGN_OR_RETURN(std::unique_ptr<PoolCopier> copier,
                       kv_transfer::make_cuda_pool_copier(pool.device.data(), bytes));
  pool.copier = std::move(copier);
  // Fill it through pinned memory.
  const std::size_t chunk = std::min<std::size_t>(bytes, std::size_t{64} << 20);
  PDS_ASSIGN_OR_RETURN(kv_transfer::StagingMemory staging, pool.copier->allocate_staging(chunk));
  std::memset(staging.get(), fill, chunk);
  for (std::size_t done = 0; done < bytes; done += chunk) {
    const PoolCopy copy{done, staging.get(), std::min(chunk, bytes - done)};
    PDS_ASSIGN_OR_RETURN(auto batch, pool.copier->start(CopyDirection::kToPool, {&copy, 1}));
    PDS_RETURN_IF_ERROR(wait_copy(*pool.copier, batch));
  }
  return pool;
}

// Whether `destination`'s bytes at the copies' remote offsets equal `source`'s at their local
// ones (read through the copiers).
Result<bool> landed_equal(Pool& source, Pool& destination, const std::vector<BlockCopy>& copies) {
  std::uint64_t largest = 0;
  for (const BlockCopy& copy : copies) largest = std::max(largest, copy.bytes);
  PDS_ASSIGN_OR_RETURN(auto a, source.copier->allocate_staging(largest));
  PDS_ASSIGN_OR_RETURN(auto b, destination.copier->allocate_staging(largest));
  for (const BlockCopy& copy : copies) {
    const PoolCopy from{copy.local_offset, a.get(), copy.bytes};
    const PoolCopy to{copy.remote_offset, b.get(), copy.bytes};
    PDS_ASSIGN_OR_RETURN(auto x, source.copier->start(CopyDirection::kToHost, {&from, 1}));
    PDS_ASSIGN_OR_RETURN(auto y, destination.copier->start(CopyDirection::kToHost, {&to, 1}));
    PDS_RETURN_IF_ERROR(wait_copy(*source.copier, x));
    PDS_RETURN_IF_ERROR(wait_copy(*destination.copier, y));
    if (std::memcmp(a.get(), b.get(), copy.bytes) != 0) return false;
  }
  return true;
}

// What a staged transfer's two services report (on their threads).
struct Arrivals {
  std::mutex mutex;
  std::condition_variable changed;
  int done = 0;
  int received = 0;
  Status failure;
};

// Open, one put per layer, close, then (once acknowledged and received) `land`, when given,
// copied into the receiver's pool (the staged path's last step).
Result<Timing> time_service(KvTransferService& sender, KvTransferService& receiver,
                            Arrivals& arrivals, Pool& receiver_pool,
                            const std::vector<std::vector<BlockCopy>>& layers,
                            const std::vector<PoolCopy>& land, int repeats) {
  {
    std::lock_guard lock(arrivals.mutex);
    arrivals.done = arrivals.received = 0;
  }
  return time_repeats(repeats, [&](int r) -> Result<double> {
    const auto start = Clock::now();
    const std::optional<uint64_t> stream =
        sender.open(receiver.descriptor_base64(), static_cast<std::uint64_t>(r),
                    std::chrono::minutes(1), [&arrivals](const KvTransferReport& report) {
                      std::lock_guard lock(arrivals.mutex);
                      ++arrivals.done;
                      if (!report.status.ok()) arrivals.failure = report.status;
                      arrivals.changed.notify_all();
                    });
    if (!stream) return unavailable("the sender is stopping");
    for (const auto& layer : layers) sender.put(*stream, layer);
    sender.close(*stream);
    {
      std::unique_lock lock(arrivals.mutex);
      const bool arrived = arrivals.changed.wait_for(lock, std::chrono::minutes(1), [&] {
        return arrivals.done > r && arrivals.received > r;
      });
      if (!arrived) return deadline_exceeded("a transfer took over a minute");
      if (!arrivals.failure.ok()) return arrivals.failure;
    }
    if (!land.empty()) {
      PDS_ASSIGN_OR_RETURN(auto batch, receiver_pool.copier->start(CopyDirection::kToPool, land));
      PDS_RETURN_IF_ERROR(wait_copy(*receiver_pool.copier, batch));
    }
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  });
}

// ucx_perftest ucp_put_bw between two processes on loopback over `tls`, at `size` bytes;
// its overall bandwidth in MB/s, or an error.
Result<double> ucx_perftest_mb_per_s(const std::string& tls, std::uint64_t size, int port) {
  const std::uint64_t iterations = std::max<std::uint64_t>(20, (std::uint64_t{1} << 30) / size);
  const std::string common = " -t ucp_put_bw -s " + std::to_string(size) + " -n " +
                             std::to_string(iterations) + " -w 5 -p " + std::to_string(port);
  const std::string env = "UCX_TLS=" + tls + " ";
  const std::string server = env + "timeout 120 ucx_perftest" + common + " >/dev/null 2>&1 &";
  if (std::system(server.c_str()) != 0) return unavailable("cannot start ucx_perftest");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const std::string client = env + "timeout 120 ucx_perftest 127.0.0.1" + common + " 2>/dev/null";
  FILE* pipe = popen(client.c_str(), "r");
  if (pipe == nullptr) return unavailable("cannot run ucx_perftest");
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  const int code = pclose(pipe);
  const size_t final_at = output.find("Final:");
  if (code != 0 || final_at == std::string::npos) {
    return unavailable("ucx_perftest failed (is ucx-utils installed?): " + output.substr(0, 200));
  }
  // Final: iterations p50 average overall bw_average bw_overall rate_average rate_overall
  double values[6] = {};
  if (std::sscanf(output.c_str() + final_at, "Final: %lf %lf %lf %lf %lf %lf", &values[0],
                  &values[1], &values[2], &values[3], &values[4], &values[5]) != 6) {
    return internal_error("cannot read ucx_perftest's Final line");
  }
  return values[5];
}

void print_row(const char* path, const std::string& tls, int tokens, int blocks, const char* layout,
               std::size_t puts, double mb, const Timing& timing) {
  std::printf("| %s | %s | %d | %d | %s | %zu | %.1f | %.2f | %.2f | %.2f | %.2f |\n", path,
              tls.c_str(), tokens, blocks, layout, puts, mb, timing.best_ms, timing.median_ms,
              mb / timing.best_ms, mb / timing.median_ms);
  std::fflush(stdout);
}

struct Settings {
  std::string config_path;
  std::string dtype_name;
  std::string device;
  std::vector<std::string> transports;
  std::vector<int> prompt_tokens;
  int pool_blocks = 0;
  int repeats = 0;
  int staging_mib = 0;
  bool perftest = true;
};

int run(const Settings& settings) {
  Result<ModelConfig> config = load_model_config(settings.config_path);
  if (!config.ok()) return report_cli_error(config.status());
  Result<DType> dtype = parse_dtype(settings.dtype_name);
  if (!dtype.ok()) return report_cli_error(dtype.status());
  if (*dtype == DType::kF16)
    return report_cli_error(invalid_argument("--dtype: the KV cache holds bf16 or fp32"));
  Result<DeviceSpec> device = parse_device(settings.device);
  if (!device.ok()) return report_cli_error(device.status());
  const KvLayout layout = kv_layout_for(*config, settings.pool_blocks, 16, *dtype);
  int largest_prompt_blocks = 0;
  for (int tokens : settings.prompt_tokens) {
    const int blocks = (tokens + layout.block_size - 1) / layout.block_size;
    if (blocks > settings.pool_blocks)
      return report_cli_error(
          invalid_argument("--pool-blocks " + std::to_string(settings.pool_blocks) +
                           " cannot hold a " + std::to_string(tokens) + "-token prompt"));
    largest_prompt_blocks = std::max(largest_prompt_blocks, blocks);
  }
  std::unique_ptr<Backend> gpu;
  if (device->kind == DeviceKind::kCuda) {
    BackendOptions options;
    options.device = DeviceKind::kCuda;
    options.device_index = device->index;
    Result<std::unique_ptr<Backend>> created = create_backend(options);
    if (!created.ok()) return report_cli_error(created.status());
    gpu = std::move(*created);
  }
  Result<Pool> source = make_pool(gpu.get(), layout.total_bytes(), 0x5a);
  Result<Pool> destination = make_pool(gpu.get(), layout.total_bytes(), 0);
  if (!source.ok()) return report_cli_error(source.status());
  if (!destination.ok()) return report_cli_error(destination.status());
  const kv_transfer::PoolMemory memory =
      gpu ? kv_transfer::PoolMemory::kCuda : kv_transfer::PoolMemory::kHost;
  std::printf(
      "model %s: %d layers, %d kv heads, head_dim %d, block 16, %s; pools of %d blocks (%.2f GB "
      "each) in %s memory%s; send ring %d MiB\n",
      settings.config_path.c_str(), layout.num_layers, layout.num_kv_heads, layout.head_dim,
      std::string(pdserve::dtype_name(layout.dtype)).c_str(), settings.pool_blocks,
      static_cast<double>(layout.total_bytes()) / 1e9, gpu ? "GPU" : "host",
      gpu ? (" (" + gpu->description() + ")").c_str() : "", settings.staging_mib);
  std::printf(
      "| path | transports | tokens | blocks | layout | puts | MB | best ms | median ms | best "
      "GB/s | median GB/s |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  std::mt19937 rng(7);
  std::vector<int> all(static_cast<size_t>(settings.pool_blocks));
  std::iota(all.begin(), all.end(), 0);
  // The blocks of each prompt: contiguous, and scattered on both sides.
  struct Prompt {
    int tokens;
    int blocks;
    bool scattered;
    std::vector<int> source, destination;
  };
  std::vector<Prompt> prompts;
  for (int tokens : settings.prompt_tokens) {
    const int blocks = (tokens + layout.block_size - 1) / layout.block_size;
    const std::vector<int> contiguous(all.begin(), all.begin() + blocks);
    prompts.push_back({tokens, blocks, false, contiguous, contiguous});
    std::vector<int> from = all, to = all;
    std::shuffle(from.begin(), from.end(), rng);
    std::shuffle(to.begin(), to.end(), rng);
    from.resize(static_cast<size_t>(blocks));
    to.resize(static_cast<size_t>(blocks));
    prompts.push_back({tokens, blocks, true, from, to});
  }

  // The copies alone: pool -> pinned host and back, each prompt's runs in one batch.
  Result<kv_transfer::StagingMemory> host = source->copier->allocate_staging(
      layout.bytes_per_block() * static_cast<std::size_t>(largest_prompt_blocks));
  if (!host.ok()) return report_cli_error(host.status());
  for (const Prompt& prompt : prompts) {
    std::vector<PoolCopy> copies;
    std::uint64_t packed = 0;
    for (const BlockCopy& copy :
         flatten(layer_copies(layout, layout, prompt.source, prompt.source))) {
      copies.push_back({copy.local_offset, host->get() + packed, copy.bytes});
      packed += copy.bytes;
    }
    for (CopyDirection direction : {CopyDirection::kToHost, CopyDirection::kToPool}) {
      Result<Timing> timing = time_repeats(settings.repeats, [&](int) -> Result<double> {
        const auto start = Clock::now();
        PDS_ASSIGN_OR_RETURN(auto batch, source->copier->start(direction, copies));
        PDS_RETURN_IF_ERROR(wait_copy(*source->copier, batch));
        return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      });
      if (!timing.ok()) return report_cli_error(timing.status());
      print_row(direction == CopyDirection::kToHost ? (gpu ? "copy D2H" : "copy pool->host")
                                                    : (gpu ? "copy H2D" : "copy host->pool"),
                source->copier->description(), prompt.tokens, prompt.blocks,
                prompt.scattered ? "scattered" : "contiguous", copies.size(),
                static_cast<double>(packed) / 1e6, *timing);
    }
  }

  int port = 20000 + static_cast<int>(rng() % 20000);
  for (const std::string& tls : settings.transports) {
    // Direct: only where UCX can address the pools.
    Arrivals direct_arrivals;
    kv_transfer::KvTransferServiceOptions direct_options;
    direct_options.transports = tls;
    direct_options.pool_memory = memory;
    direct_options.path = kv_transfer::TransferPath::kDirect;
    direct_options.bind_thread = [copier = source->copier] { return copier->bind_thread(); };
    auto direct_sender =
        KvTransferService::create(direct_options, source->data(), layout.total_bytes(), nullptr);
    auto direct_receiver = KvTransferService::create(
        direct_options, destination->data(), layout.total_bytes(),
        [&direct_arrivals](const kv_transfer::ReceivedTransfer&) {
          std::lock_guard lock(direct_arrivals.mutex);
          ++direct_arrivals.received;
          direct_arrivals.changed.notify_all();
        });
    const bool direct = direct_sender.ok() && direct_receiver.ok();
    if (!direct && !gpu) {
      return report_cli_error(direct_sender.ok() ? direct_receiver.status()
                                                 : direct_sender.status());
    }
    if (!direct) {
      std::printf("| direct | %s | - | - | - | - | - | n/a: %s | | | |\n", tls.c_str(),
                  direct_sender.status().message().c_str());
    }
    // Staged: sender and receiver services, the receiver's landing area holding the largest
    // prompt.
    KvLayout landing = layout;
    landing.num_blocks = largest_prompt_blocks;
    Arrivals arrivals;
    kv_transfer::KvTransferServiceOptions staged;
    staged.transports = tls;
    staged.pool_memory = memory;
    staged.path = kv_transfer::TransferPath::kStaged;
    staged.staging_unit = layout.layer_block_bytes();
    staged.copier = source->copier;
    staged.send_bytes = std::uint64_t(settings.staging_mib) << 20;
    staged.bind_thread = [copier = source->copier] { return copier->bind_thread(); };
    auto staged_sender =
        KvTransferService::create(staged, source->data(), layout.total_bytes(), nullptr);
    staged.copier = destination->copier;
    staged.send_bytes = 0;
    staged.landing_bytes = landing.total_bytes();
    staged.bind_thread = [copier = destination->copier] { return copier->bind_thread(); };
    auto staged_receiver =
        KvTransferService::create(staged, destination->data(), layout.total_bytes(),
                                  [&arrivals](const kv_transfer::ReceivedTransfer&) {
                                    std::lock_guard lock(arrivals.mutex);
                                    ++arrivals.received;
                                    arrivals.changed.notify_all();
                                  });
    if (!staged_sender.ok()) return report_cli_error(staged_sender.status());
    if (!staged_receiver.ok()) return report_cli_error(staged_receiver.status());

    for (const Prompt& prompt : prompts) {
      const char* shape = prompt.scattered ? "scattered" : "contiguous";
      const auto copies = flatten(layer_copies(layout, layout, prompt.source, prompt.destination));
      std::uint64_t bytes = 0;
      for (const BlockCopy& copy : copies) bytes += copy.bytes;
      const double mb = static_cast<double>(bytes) / 1e6;
      if (direct) {
        const auto layers = layer_copies(layout, layout, prompt.source, prompt.destination);
        Result<Timing> timing = time_service(**direct_sender, **direct_receiver, direct_arrivals,
                                             *destination, layers, {}, settings.repeats);
        if (!timing.ok())
          return report_cli_error(timing.status().with_context(
              "direct, " + tls + ", " + std::to_string(prompt.tokens) + " tokens"));
        print_row("direct", tls, prompt.tokens, prompt.blocks, shape, copies.size(), mb, *timing);
        Result<bool> equal = landed_equal(*source, *destination, copies);
        if (!equal.ok() || !*equal)
          return report_cli_error(internal_error("the direct path's bytes did not land"));
      }
      // Staged: into landing blocks 0..B-1, then into the pool's destination blocks.
      std::vector<int> landing_blocks(static_cast<size_t>(prompt.blocks));
      std::iota(landing_blocks.begin(), landing_blocks.end(), 0);
      const auto layers = layer_copies(layout, landing, prompt.source, landing_blocks);
      std::vector<PoolCopy> land;
      for (const BlockCopy& copy :
           flatten(layer_copies(landing, layout, landing_blocks, prompt.destination))) {
        land.push_back({copy.remote_offset, (*staged_receiver)->landing_area() + copy.local_offset,
                        copy.bytes});
      }
      std::size_t puts = 0;
      for (const auto& layer : layers) puts += layer.size();
      Result<Timing> timing = time_service(**staged_sender, **staged_receiver, arrivals,
                                           *destination, layers, land, settings.repeats);
      if (!timing.ok())
        return report_cli_error(timing.status().with_context(
            "staged, " + tls + ", " + std::to_string(prompt.tokens) + " tokens"));
      print_row("staged", tls, prompt.tokens, prompt.blocks, shape, puts, mb, *timing);
      Result<bool> equal = landed_equal(*source, *destination, copies);
      if (!equal.ok() || !*equal)
        return report_cli_error(internal_error("the staged path's bytes did not land"));
    }
    if (settings.perftest) {
      for (int tokens : settings.prompt_tokens) {
        const int blocks = (tokens + layout.block_size - 1) / layout.block_size;
        const std::uint64_t size = layout.layer_block_bytes() * static_cast<std::uint64_t>(blocks);
        Result<double> mb_per_s = ucx_perftest_mb_per_s(tls, size, port++);
        if (!mb_per_s.ok()) {
          std::printf(
              "| ucx_perftest put_bw | %s | %d | - | %llu B puts | - | - | - | - | %s | |\n",
              tls.c_str(), tokens, static_cast<unsigned long long>(size),
              mb_per_s.status().message().c_str());
          continue;
        }
        std::printf(
            "| ucx_perftest put_bw (host) | %s | %d | - | one %.1f MB put, repeated | - | - "
            "| - | - | %.2f | %.2f |\n",
            tls.c_str(), tokens, static_cast<double>(size) / 1e6, *mb_per_s / 1e3, *mb_per_s / 1e3);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  pdserve::Settings settings;
  settings.config_path = std::string(PDSERVE_ASSETS_DIR) + "/qwen3-0.6b/config.json";
  settings.dtype_name = "bf16";
  settings.device = "cpu";
  settings.transports = {"tcp", "sm,self"};
  settings.prompt_tokens = {1024, 8192};
  settings.pool_blocks = 768;
  settings.repeats = 10;
  settings.staging_mib = 64;
  bool no_perftest = false;
  CLI::App app{
      "pdserve-bench-kv-transfer: KV-block transfer bandwidth per path (direct, staged) between "
      "two UCX endpoints (loopback), against the pool copies and ucx_perftest"};
  app.add_option("--config", settings.config_path,
                 "Model config.json (the KV pool takes its shape)")
      ->capture_default_str();
  app.add_option("--dtype", settings.dtype_name, "KV dtype: bf16 or fp32")->capture_default_str();
  app.add_option("--device", settings.device, "Where the pools are: cpu or cuda:N")
      ->capture_default_str();
  app.add_option("--transports", settings.transports, "UCX_TLS values to measure, one per run")
      ->capture_default_str();
  app.add_option("--tokens", settings.prompt_tokens, "Prompt lengths in tokens")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--pool-blocks", settings.pool_blocks, "Blocks in each pool")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--repeats", settings.repeats, "Timed transfers per point (after one warm-up)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--staging-mib", settings.staging_mib, "The staged sender's send ring")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  app.add_flag("--no-perftest", no_perftest, "Skip the ucx_perftest baseline");
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  settings.perftest = !no_perftest;
  return pdserve::run(settings);
}
