// pdserve-bench-routing: what cache-aware routing costs the proxy per request, by part: parsing,
// templating and tokenizing the prompt (PromptTokenizer) and choosing the nodes
// (NodeRegistry::pick_decode + rank_prefill against full prefix-key sets). One thread, the
// same code the proxy runs on its HTTP threads; the figure is held against 1 ms per request.
// Lives with the proxy because it drives the proxy's own classes (no module includes a
// binary's folder but itself).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/core/cli.h"
#include "proxy/routing/placement.h"

namespace pdserve::proxy {
namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string tokenizer_dir = std::string(PDSERVE_ASSETS_DIR) + "/qwen3-tokenizer";
  int decode_nodes = 8;
  int prefill_nodes = 8;
  size_t keys_per_node = 65'536;
  size_t max_prompt_bytes = 8'192;
  int iterations = 500;
};

// A chat body whose system prompt is about `bytes` of English lines.
std::string chat_body(size_t bytes, int request) {
  static const char* kLine = "You are a helpful assistant for the support team of a storage company.\n";
  std::string system;
  while (system.size() < bytes) system += kLine;
  return Json{{"model", "m"},
              {"messages",
               {{{"role", "system"}, {"content", system}},
                {{"role", "user"}, {"content", "Question number " + std::to_string(request)}}}},
              {"max_tokens", 16}}
      .dump();
}

// This thread's CPU time: what the work costs whatever else the machine runs.
double thread_cpu_us() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e6 + static_cast<double>(now.tv_nsec) / 1e3;
}

double percentile(std::vector<double> values, double fraction) {
  std::ranges::sort(values);
  return values[std::min(values.size() - 1, static_cast<size_t>(fraction * values.size()))];
}

Status run(const Options& options) {
  PDS_ASSIGN_OR_RETURN(PromptTokenizer tokenizer,
                       PromptTokenizer::load(options.tokenizer_dir, options.max_prompt_bytes));
  RegistryOptions registry_options;
  registry_options.prefix_keys_per_node = options.keys_per_node;
  NodeRegistry registry(registry_options);
  const auto now = Clock::now();
  std::mt19937_64 random(1);
  const std::optional<PromptTokens> shared = tokenizer.tokens(PromptKind::kChat, chat_body(4096, 0));
  if (!shared) return internal_error("the benchmark's prompt did not tokenize");
  const std::vector<uint64_t> shared_chain = reusable_block_chain(shared->ids, 16);
  // Every node's key set full of other keys; one decode and one prefill node also hold the
  // shared system prompt.
  for (int index = 0; index < options.decode_nodes + options.prefill_nodes; ++index) {
    const bool decode = index < options.decode_nodes;
    Json registration = {{"role", decode ? "decode" : "prefill"},
                         {"url", "http://127.0.0.1:" + std::to_string(10'000 + index)},
                         {"model", "m"},
                         {"kv_blocks_total", 100'000}};
    PDS_ASSIGN_OR_RETURN(const std::string id, registry.register_node(registration, now));
    for (size_t sent = 0; sent < options.keys_per_node; sent += kMaxPrefixReportHashes) {
      PrefixCacheReport report{16, false, {}, {}};
      for (size_t key = 0; key < kMaxPrefixReportHashes; ++key) report.stored.push_back(random());
      if (sent + kMaxPrefixReportHashes >= options.keys_per_node &&
          (index == 0 || index == options.decode_nodes)) {
        std::ranges::copy(shared_chain, report.stored.end() - static_cast<ptrdiff_t>(shared_chain.size()));
      }
      const Json body = {{"load", {{"kv_blocks_total", 100'000}, {"kv_blocks_used", index * 100}}},
                         {"prefix_cache", report.to_json()}};
      PDS_RETURN_IF_ERROR(registry.heartbeat(id, body, now).status());
    }
  }
  std::printf("%d decode + %d prefill nodes, %zu keys held in all (%zu per node at most), "
              "prompts tokenized up to %zu bytes, %d requests per size\n\n",
              options.decode_nodes, options.prefill_nodes, registry.prefix_keys(),
              options.keys_per_node, options.max_prompt_bytes, options.iterations);
  std::printf("| body | prompt tokens hashed | tokenize p50 / p99 (us) | pick + rank p50 / p99 (us) | "
              "total p50 / p99 / max (us) | total CPU time p50 / p99 (us) |\n"
              "|---|---|---|---|---|---|\n");
  for (const size_t bytes : {size_t{256}, size_t{2048}, size_t{8192}, size_t{16'384}, size_t{65'536}}) {
    std::vector<double> tokenize_us, route_us, total_us, cpu_us;
    size_t hashed = 0;
    std::string body_size;
    for (int request = 0; request < options.iterations; ++request) {
      const std::string body = chat_body(bytes, request);
      body_size = std::to_string(body.size() / 1024.0).substr(0, 4) + " KiB";
      const double cpu_start = thread_cpu_us();
      const auto start = Clock::now();
      const std::optional<PromptTokens> tokens = tokenizer.tokens(PromptKind::kChat, body);
      const auto tokenized = Clock::now();
      const RoutingQuery query{tokens ? std::span<const int32_t>(tokens->ids)
                                      : std::span<const int32_t>(),
                               static_cast<int64_t>(body.size() / 4)};
      const std::optional<NodeRef> decode = registry.pick_decode({}, now, query);
      const std::vector<NodeRef> prefill = registry.rank_prefill(now, query);
      const auto routed = Clock::now();
      cpu_us.push_back(thread_cpu_us() - cpu_start);
      if (!decode || prefill.empty()) return internal_error("no node was chosen");
      hashed = tokens ? tokens->ids.size() : 0;
      tokenize_us.push_back(std::chrono::duration<double, std::micro>(tokenized - start).count());
      route_us.push_back(std::chrono::duration<double, std::micro>(routed - tokenized).count());
      total_us.push_back(std::chrono::duration<double, std::micro>(routed - start).count());
    }
    std::printf("| %s | %zu | %.0f / %.0f | %.0f / %.0f | %.0f / %.0f / %.0f | %.0f / %.0f |\n",
                body_size.c_str(), hashed, percentile(tokenize_us, 0.5),
                percentile(tokenize_us, 0.99), percentile(route_us, 0.5),
                percentile(route_us, 0.99), percentile(total_us, 0.5), percentile(total_us, 0.99),
                percentile(total_us, 1.0), percentile(cpu_us, 0.5), percentile(cpu_us, 0.99));
  }
  return Status::ok_status();
}

}  // namespace
}  // namespace pdserve::proxy

int main(int argc, char** argv) {
  pdserve::proxy::Options options;
  CLI::App app{"pdserve-bench-routing: the proxy's cost of cache-aware routing per request"};
  app.add_option("--tokenizer", options.tokenizer_dir, "Model folder with tokenizer.json")
      ->capture_default_str();
  app.add_option("--decode-nodes", options.decode_nodes)->capture_default_str()->check(CLI::Range(1, 1024));
  app.add_option("--prefill-nodes", options.prefill_nodes)->capture_default_str()->check(CLI::Range(1, 1024));
  app.add_option("--keys-per-node", options.keys_per_node, "Prefix keys each node holds")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 22));
  app.add_option("--route-max-prompt-bytes", options.max_prompt_bytes)
      ->capture_default_str()
      ->check(CLI::Range(size_t{256}, size_t{16} << 20));
  app.add_option("--iterations", options.iterations, "Requests per body size")
      ->capture_default_str()
      ->check(CLI::Range(1, 1'000'000));
  if (int code = pdserve::parse_cli(app, argc, argv); code >= 0) return code;
  pdserve::Status status = pdserve::capture_status([&] { return pdserve::proxy::run(options); });
  return status.ok() ? 0 : pdserve::report_cli_error(status);
}
