// pdserve-bench-kv-checksum: what the KV integrity check (kv_transfer/kv_checksum.h) costs.
// For each model config and prompt length, in a pool of that model's shape holding just the
// prompt's blocks (contiguous, as a decode node hands them out): the XXH3 checksum of every
// block (what each side computes once per transfer) against a memcpy of the same bytes measured
// in the same run, and against the transfer itself: the same blocks put over UCX loopback
// between two engines in this process (tcp and sm,self), submit to acknowledged completion.
// The sender checksums before its completion message and the receiver after it, so a transfer
// gets 2 x the checksum time longer; its share is printed against the measured transfers and
// against the raw time of the bytes on 100 and 400 Gb/s links.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/core/cli.h"
#include "common/model/model_config.h"
#include "kernels/model/kv_cache.h"
#include "kv_transfer/kv_checksum.h"
#include "kv_transfer/kv_transfer_engine.h"

namespace pdserve {
namespace {

using kv_transfer::BlockCopy;
using kv_transfer::KvTransferEngine;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Best of `repeats` runs of `fn` after one warm-up, in ms.
template <typename Fn>
double best_ms(int repeats, Fn&& fn) {
  fn();
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    fn();
    best = std::min(best, ms_since(start));
  }
  return best;
}

// Best time of `repeats` transfers of the whole pool (one put per layer and half) over `tls`.
Result<double> transfer_ms(const std::string& tls, std::vector<std::byte>& source,
                           std::vector<std::byte>& destination, const KvLayout& layout,
                           int repeats) {
  PDS_ASSIGN_OR_RETURN(auto sender, KvTransferEngine::create({tls}));
  PDS_ASSIGN_OR_RETURN(auto receiver, KvTransferEngine::create({tls}));
  PDS_RETURN_IF_ERROR(sender->register_pool(source.data(), source.size()));
  PDS_RETURN_IF_ERROR(receiver->register_pool(destination.data(), destination.size()));
  PDS_ASSIGN_OR_RETURN(const kv_transfer::PeerDescriptor descriptor, receiver->local_descriptor());
  PDS_ASSIGN_OR_RETURN(const kv_transfer::PeerId peer, sender->connect(descriptor));
  std::vector<BlockCopy> copies;
  for (int layer = 0; layer < layout.num_layers; ++layer) {
    for (bool value_half : {false, true}) {
      const std::uint64_t at = layout.offset(layer, 0, value_half);
      copies.push_back({at, at, layout.layer_block_bytes() * static_cast<size_t>(layout.num_blocks)});
    }
  }
  Status failure;
  std::uint64_t tag = 0;
  const double best = best_ms(repeats, [&] {
    Result<kv_transfer::TransferId> id =
        sender->submit_puts(peer, copies, ++tag, std::chrono::milliseconds(120'000));
    if (!id.ok()) {
      failure = id.status();
      return;
    }
    for (;;) {
      sender->progress();
      receiver->progress();
      Result<kv_transfer::TransferStatus> status = sender->poll(*id);
      if (!status.ok() || status->state == kv_transfer::TransferState::kFailed) {
        failure = status.ok() ? status->error : status.status();
        return;
      }
      if (status->state == kv_transfer::TransferState::kDone) break;
    }
    receiver->take_received();
  });
  if (!failure.ok()) return failure.with_context(tls);
  return best;
}

int run(const std::vector<std::string>& configs, const std::vector<int>& prompt_tokens,
        const std::string& dtype_name, const std::vector<std::string>& transports, int repeats) {
  Result<DType> dtype = parse_dtype(dtype_name);
  if (!dtype.ok()) return report_cli_error(dtype.status());
  if (*dtype == DType::kF16)
    return report_cli_error(invalid_argument("--dtype: the KV cache holds bf16 or fp32"));
  std::printf(
      "| model | tokens | blocks | KV MB | memcpy ms | memcpy GB/s | checksum ms (one side) | checksum "
      "GB/s | vs memcpy |");
  for (const std::string& tls : transports) std::printf(" %s transfer ms | share |", tls.c_str());
  std::printf(" share at 100 Gb/s | share at 400 Gb/s |\n|---|---|---|---|---|---|---|---|---|");
  for (size_t i = 0; i < transports.size(); ++i) std::printf("---|---|");
  std::printf("---|---|\n");
  for (const std::string& config_path : configs) {
    Result<ModelConfig> config = load_model_config(config_path);
    if (!config.ok()) return report_cli_error(config.status());
    for (int tokens : prompt_tokens) {
      const int blocks = (tokens + 15) / 16;
      const KvLayout layout = kv_layout_for(*config, blocks, 16, *dtype);
      // Random bytes (no shortcut for the hash), touched before timing.
      std::vector<std::byte> source(layout.total_bytes());
      std::mt19937_64 rng(7);
      for (size_t at = 0; at + 8 <= source.size(); at += 8) {
        const std::uint64_t word = rng();
        std::memcpy(source.data() + at, &word, 8);
      }
      std::vector<std::byte> destination(source.size(), std::byte{0});
      std::vector<int32_t> block_ids(static_cast<size_t>(blocks));
      for (int b = 0; b < blocks; ++b) block_ids[static_cast<size_t>(b)] = b;
      const double bytes = static_cast<double>(source.size());
      const double copy = best_ms(repeats, [&] {
        std::memcpy(destination.data(), source.data(), source.size());
      });
      std::vector<std::uint64_t> sums;
      const double checksum = best_ms(repeats, [&] {
        sums = kv_transfer::prompt_block_checksums(source.data(), layout, block_ids, 0, tokens);
      });
      if (sums.size() != static_cast<size_t>(blocks))
        return report_cli_error(internal_error("not one checksum per block"));
      const std::string model = std::filesystem::path(config_path).parent_path().filename();
      std::printf("| %s | %d | %d | %.1f | %.2f | %.2f | %.2f | %.2f | %.2fx |", model.c_str(),
                  tokens, blocks, bytes / 1e6, copy, bytes / copy / 1e6, checksum,
                  bytes / checksum / 1e6, copy / checksum);
      for (const std::string& tls : transports) {
        Result<double> transfer = transfer_ms(tls, source, destination, layout, repeats);
        if (!transfer.ok()) return report_cli_error(transfer.status());
        std::printf(" %.1f | %.1f%% |", *transfer, 100.0 * 2 * checksum / (*transfer + 2 * checksum));
      }
      for (double gbit : {100.0, 400.0}) {
        const double wire_ms = bytes * 8 / (gbit * 1e9) * 1e3;
        std::printf(" %.1f%% |", 100.0 * 2 * checksum / (wire_ms + 2 * checksum));
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  std::vector<std::string> configs = {std::string(PDSERVE_ASSETS_DIR) + "/qwen3-0.6b/config.json",
                                      std::string(PDSERVE_ASSETS_DIR) + "/qwen3-8b/config.json"};
  std::vector<int> prompt_tokens = {1024, 4096};
  std::string dtype = "bf16";
  std::vector<std::string> transports = {"tcp", "sm,self"};
  int repeats = 5;
  CLI::App app{"pdserve-bench-kv-checksum: cost of the KV blocks' XXH3 checksums"};
  app.add_option("--config", configs, "Model config.json files (the pool takes each shape)")
      ->capture_default_str();
  app.add_option("--tokens", prompt_tokens, "Prompt lengths in tokens")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--dtype", dtype, "KV dtype: bf16 or fp32")->capture_default_str();
  app.add_option("--transports", transports, "UCX_TLS values of the measured transfers")
      ->capture_default_str();
  app.add_option("--repeats", repeats, "Timed runs per figure (best is kept, after a warm-up)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  return pdserve::run(configs, prompt_tokens, dtype, transports, repeats);
}
