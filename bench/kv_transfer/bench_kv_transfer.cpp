// pdserve-bench-kv-transfer: KV-transfer bandwidth between two KvTransferEngines in one process
// (loopback), for a Qwen3 prompt's blocks in a pool of that model's layout. The pool is laid out
// K then V, [layers][blocks][...], so a prompt costs one put per (layer, K/V, run of blocks
// contiguous on both sides): contiguous block ids coalesce into 2 * layers puts, scattered ids
// into one put per block. Timed from submit_puts to the acknowledged completion.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/core/cli.h"
#include "common/model/model_config.h"
#include "kernels/model/kv_cache.h"
#include "kv_transfer/kv_transfer_engine.h"

namespace pdserve {
namespace {

using kv_transfer::BlockCopy;
using kv_transfer::KvTransferEngine;
using kv_transfer::TransferState;
using Clock = std::chrono::steady_clock;

// The puts moving `source_blocks[i]` to `destination_blocks[i]` for every layer's K and V,
// merging neighbours that are consecutive in both pools.
std::vector<BlockCopy> block_copies(const KvLayout& layout,
                                    const std::vector<int>& source_blocks,
                                    const std::vector<int>& destination_blocks) {
  const std::uint64_t block_bytes = layout.layer_block_bytes();
  std::vector<BlockCopy> copies;
  for (bool value_half : {false, true}) {
    for (int layer = 0; layer < layout.num_layers; ++layer) {
      for (size_t i = 0; i < source_blocks.size(); ++i) {
        const bool extends_run = i > 0 && source_blocks[i] == source_blocks[i - 1] + 1 &&
                                 destination_blocks[i] == destination_blocks[i - 1] + 1;
        if (extends_run) {
          copies.back().bytes += block_bytes;
        } else {
          copies.push_back({layout.offset(layer, source_blocks[i], value_half),
                            layout.offset(layer, destination_blocks[i], value_half),
                            block_bytes});
        }
      }
    }
  }
  return copies;
}

struct Timing {
  double best_ms = 0;
  double median_ms = 0;
};

// Submits `copies` `repeats` times (after one warm-up), each time driving both engines until the
// sender sees the acknowledgement.
Result<Timing> time_transfers(KvTransferEngine& sender, KvTransferEngine& receiver,
                              kv_transfer::PeerId peer, const std::vector<BlockCopy>& copies,
                              int repeats) {
  std::vector<double> samples;
  for (int r = 0; r <= repeats; ++r) {
    const auto start = Clock::now();
    Result<kv_transfer::TransferId> id = sender.submit_puts(
        peer, copies, static_cast<std::uint64_t>(r), std::chrono::milliseconds(60000));
    if (!id.ok()) return id.status();
    for (;;) {
      sender.progress();
      receiver.progress();
      Result<kv_transfer::TransferStatus> status = sender.poll(*id);
      if (!status.ok()) return status.status();
      if (status->state == TransferState::kFailed) return status->error;
      if (status->state == TransferState::kDone) break;
    }
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (receiver.take_received().size() != 1)
      return internal_error("receiver saw no single completion");
    if (r > 0) samples.push_back(ms);  // r == 0 warms up (first-touch, UCX lazy set-up)
  }
  std::sort(samples.begin(), samples.end());
  return Timing{samples.front(), samples[samples.size() / 2]};
}

int run(const std::string& config_path, const std::string& dtype_name,
        const std::vector<std::string>& transports, const std::vector<int>& prompt_tokens,
        int pool_blocks, int repeats) {
  Result<ModelConfig> config = load_model_config(config_path);
  if (!config.ok()) return report_cli_error(config.status());
  Result<DType> dtype = parse_dtype(dtype_name);
  if (!dtype.ok()) return report_cli_error(dtype.status());
  if (*dtype == DType::kF16)
    return report_cli_error(invalid_argument("--dtype: the KV cache holds bf16 or fp32"));
  const KvLayout layout = kv_layout_for(*config, pool_blocks, 16, *dtype);
  for (int tokens : prompt_tokens) {
    if ((tokens + layout.block_size - 1) / layout.block_size > pool_blocks)
      return report_cli_error(invalid_argument("--pool-blocks " + std::to_string(pool_blocks) +
                                               " cannot hold a " + std::to_string(tokens) +
                                               "-token prompt"));
  }
  // Touched before registration so that page faults are not timed.
  std::vector<std::uint8_t> source(layout.total_bytes(), 0x5a);
  std::vector<std::uint8_t> destination(layout.total_bytes(), 0);
  std::printf(
      "model %s: %d layers, %d kv heads, head_dim %d, block 16, %s; pool %d blocks (%.2f GB each "
      "side)\n",
      config_path.c_str(), layout.num_layers, layout.num_kv_heads, layout.head_dim,
      std::string(pdserve::dtype_name(layout.dtype)).c_str(), pool_blocks,
      static_cast<double>(layout.total_bytes()) / 1e9);
  std::printf(
      "| transports | tokens | blocks | layout | puts | MB | best ms | median ms | best GB/s | "
      "median GB/s |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  std::mt19937 rng(7);
  for (const std::string& tls : transports) {
    auto sender = KvTransferEngine::create({tls});
    auto receiver = KvTransferEngine::create({tls});
    if (!sender.ok()) return report_cli_error(sender.status());
    if (!receiver.ok()) return report_cli_error(receiver.status());
    if (Status s = (*sender)->register_pool(source.data(), source.size()); !s.ok())
      return report_cli_error(s);
    if (Status s = (*receiver)->register_pool(destination.data(), destination.size()); !s.ok())
      return report_cli_error(s);
    Result<kv_transfer::PeerDescriptor> descriptor = (*receiver)->local_descriptor();
    if (!descriptor.ok()) return report_cli_error(descriptor.status());
    Result<kv_transfer::PeerId> peer = (*sender)->connect(*descriptor);
    if (!peer.ok()) return report_cli_error(peer.status());
    for (int tokens : prompt_tokens) {
      const int blocks = (tokens + layout.block_size - 1) / layout.block_size;
      std::vector<int> all(static_cast<size_t>(pool_blocks));
      std::iota(all.begin(), all.end(), 0);
      const std::vector<int> contiguous(all.begin(), all.begin() + blocks);
      std::vector<int> scattered_source = all, scattered_destination = all;
      std::shuffle(scattered_source.begin(), scattered_source.end(), rng);
      std::shuffle(scattered_destination.begin(), scattered_destination.end(), rng);
      scattered_source.resize(static_cast<size_t>(blocks));
      scattered_destination.resize(static_cast<size_t>(blocks));
      for (bool scattered : {false, true}) {
        const std::vector<BlockCopy> copies =
            scattered ? block_copies(layout, scattered_source, scattered_destination)
                      : block_copies(layout, contiguous, contiguous);
        std::uint64_t bytes = 0;
        for (const BlockCopy& copy : copies) bytes += copy.bytes;
        Result<Timing> timing = time_transfers(**sender, **receiver, *peer, copies, repeats);
        if (!timing.ok())
          return report_cli_error(
              timing.status().with_context(tls + ", " + std::to_string(tokens) + " tokens"));
        std::printf("| %s | %d | %d | %s | %zu | %.1f | %.2f | %.2f | %.2f | %.2f |\n", tls.c_str(),
                    tokens, blocks, scattered ? "scattered" : "contiguous", copies.size(),
                    static_cast<double>(bytes) / 1e6, timing->best_ms, timing->median_ms,
                    static_cast<double>(bytes) / timing->best_ms / 1e6,
                    static_cast<double>(bytes) / timing->median_ms / 1e6);
        std::fflush(stdout);
      }
    }
    // A spot check that the last transfer carried the pool's bytes (the source is all 0x5a).
    if (std::count(destination.begin(), destination.end(), std::uint8_t{0x5a}) == 0)
      return report_cli_error(internal_error("no byte arrived in the destination pool"));
    std::fill(destination.begin(), destination.end(), std::uint8_t{0});
  }
  return 0;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  std::string config = std::string(PDSERVE_ASSETS_DIR) + "/qwen3-0.6b/config.json";
  std::string dtype = "bf16";
  std::vector<std::string> transports = {"tcp", "sm,self"};
  std::vector<int> prompt_tokens = {1024, 8192};
  int pool_blocks = 768;
  int repeats = 10;
  CLI::App app{
      "pdserve-bench-kv-transfer: KV-block transfer bandwidth between two UCX engines (loopback)"};
  app.add_option("--config", config, "Model config.json (the KV pool takes its shape)")
      ->capture_default_str();
  app.add_option("--dtype", dtype, "KV dtype: bf16 or fp32")->capture_default_str();
  app.add_option("--transports", transports, "UCX_TLS values to measure, one per run")
      ->capture_default_str();
  app.add_option("--tokens", prompt_tokens, "Prompt lengths in tokens")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--pool-blocks", pool_blocks, "Blocks in each pool")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--repeats", repeats, "Timed transfers per point (after one warm-up)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  return pdserve::run(config, dtype, transports, prompt_tokens, pool_blocks, repeats);
}
