// The full-depth synthetic Qwen3-0.6B-shape model (28 layers, random weights) through the
// engine thread (LlmEngine: scheduler, continuous batching, chunked prefill, the model runner
// with its decode CUDA graphs and sampling on the GPU, logprobs from the raw rows it copies
// back) on the CUDA backend, three prompts at once, 64 greedy tokens each, against the same
// engine on the CPU backend in float32:
//  - strict float32 on CUDA gives the same ids. A difference is allowed only where the CPU's
//    top-2 logprob margin is under kTieMargin and CUDA picked the CPU's second choice (a tie
//    at float32 precision), and is reported;
//  - bf16 on CUDA is reported with the logit margins where it leaves the CPU's ids; its token
//    there must be among the CPU's top 5 (a wrong kernel picks garbage).
// The float32 engine sizes its pool as serving does by default (--gpu-memory-utilization), the
// bf16 one by --kv-cache-memory-gib, so both ways serving/engine_assembly.cpp sizes a CUDA
// pool run here.
// PDSERVE_GPU_MODEL_DIR names a checkpoint made already (run-gpu-tests.sh makes one for all
// its stages); else the test writes one. On the CPU run (gpu_test_main.h) the CPU backend
// stands in for the device and the model has 2 layers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common/model/synthetic_checkpoint.h"
#include "common/tokenizer/tokenizer.h"
#include "serving/engine_assembly.h"
#include "tests/kernels_gpu/gpu_test_main.h"

namespace pdserve {
namespace {

using namespace std::chrono_literals;

constexpr int kNewTokens = 64;
constexpr int kTopLogprobs = 5;
// Largest CPU top-2 logprob margin at which strict float32 may pick the other token.
constexpr float kTieMargin = 2e-3f;

struct Generation {
  std::vector<int32_t> tokens;
  std::vector<SampledTokenLogprobs> logprobs;
  Status error;
  bool finished = false;
};

// The test's model folder, written once per process unless PDSERVE_GPU_MODEL_DIR names one.
class TestModel {
 public:
  TestModel() {
    const char* given = std::getenv("PDSERVE_GPU_MODEL_DIR");
    if (given != nullptr && *given != '\0' && !gpu_test::on_cpu()) {
      dir_ = given;
      return;
    }
    SyntheticCheckpointOptions options;
    options.config_path = gpu_test::folder("PDSERVE_SOURCE_DIR", PDSERVE_SOURCE_DIR) /
                          "configs/models/qwen3-0.6b/config.json";
    options.out_dir = gpu_test::folder("PDSERVE_BINARY_DIR", PDSERVE_BINARY_DIR) / "test-models" /
                      ("engine-0.6b-" + std::to_string(::getpid()));
    options.seed = 1;
    if (gpu_test::on_cpu()) options.num_layers = 2;  // the full depth takes minutes there
    options.dtype = DType::kBF16;
    options.tokenizer_dir =
        gpu_test::folder("PDSERVE_ASSETS_DIR", PDSERVE_ASSETS_DIR) / "qwen3-tokenizer";
    const Result<SyntheticCheckpoint> written = write_synthetic_checkpoint(options);
    EXPECT_TRUE(written.ok()) << written.status().to_string();
    dir_ = options.out_dir;
    owned_ = true;
  }
  ~TestModel() {
    std::error_code ignored;
    if (owned_) std::filesystem::remove_all(dir_, ignored);
  }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  bool owned_ = false;
};

const TestModel& test_model() {
  static const TestModel model;
  return model;
}

std::vector<std::vector<int32_t>> prompts() {
  std::mt19937 random(2026);
  std::uniform_int_distribution<int32_t> token(0, 151000);
  std::vector<std::vector<int32_t>> all;
  for (int length : {7, 120, 300}) {
    std::vector<int32_t> prompt(static_cast<size_t>(length));
    for (int32_t& t : prompt) t = token(random);
    all.push_back(std::move(prompt));
  }
  return all;
}

// How the engine's KV pool is sized: as serving/engine_assembly.h does by default on each
// backend (on CUDA the runner measures the memory a profiling step leaves and takes what
// --gpu-memory-utilization allows), or by --kv-cache-memory-gib, which on CUDA overrides it.
enum class PoolSizing { kDefault, kKvCacheMemoryGib };

// Runs every prompt through one engine at once; each request's tokens and logprobs.
std::vector<Generation> generate(const ModelLoadOptions& options, PoolSizing sizing) {
  LoadedModel loaded = std::move(load_model(test_model().dir().string(), options)).value();
  Tokenizer tokenizer = std::move(Tokenizer::from_model_dir(test_model().dir())).value();
  std::printf("  engine on %s, weights %s\n", loaded.backend->description().c_str(),
              std::string(dtype_name(loaded.model->weight_dtype())).c_str());
  EngineConfig config;
  if (sizing == PoolSizing::kKvCacheMemoryGib) config.kv_cache_memory_gib = 0.5;
  config.max_model_len = 512;
  config.max_num_seqs = 4;
  config.max_num_batched_tokens = 256;  // the 300-token prompt is prefilled in two chunks
  std::unique_ptr<LlmEngine> engine = std::move(make_llm_engine(loaded, tokenizer, config)).value();
  EXPECT_TRUE(engine->start().ok());
  const std::vector<std::vector<int32_t>> all = prompts();
  std::vector<Generation> results(all.size());
  std::mutex mutex;
  std::condition_variable done;
  size_t finished = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    InferenceRequest request;
    request.id = "prompt-" + std::to_string(i);
    request.prompt_tokens = all[i];
    request.sampling.temperature = 0.0f;
    request.sampling.max_tokens = kNewTokens;
    request.sampling.ignore_eos = true;
    request.sampling.want_logprobs = true;
    request.sampling.logprobs = kTopLogprobs;
    const Status submitted = engine->submit(std::move(request), [&, i](SequenceDelta delta) {
      std::lock_guard lock(mutex);
      Generation& result = results[i];
      result.tokens.insert(result.tokens.end(), delta.token_ids.begin(), delta.token_ids.end());
      result.logprobs.insert(result.logprobs.end(), delta.logprobs.begin(), delta.logprobs.end());
      if (delta.finished) {
        result.finished = true;
        result.error = delta.error;
        ++finished;
        done.notify_all();
      }
    });
    EXPECT_TRUE(submitted.ok()) << submitted.to_string();
  }
  {
    std::unique_lock lock(mutex);
    EXPECT_TRUE(done.wait_for(lock, 600s, [&] { return finished == all.size(); }))
        << "the engine did not finish the requests within 600 s";
  }
  engine->stop();
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_TRUE(results[i].error.ok()) << "prompt " << i << ": " << results[i].error.to_string();
    EXPECT_EQ(results[i].tokens.size(), static_cast<size_t>(kNewTokens)) << "prompt " << i;
    EXPECT_EQ(results[i].logprobs.size(), results[i].tokens.size()) << "prompt " << i;
  }
  return results;
}

// pdserve-generate's --device cuda --dtype D, or --device cpu --dtype float32 (the reference,
// and the device's stand-in on the CPU run).
ModelLoadOptions device_options(DType activation) {
  ModelLoadOptions options;
  if (gpu_test::on_cpu()) {
    options.dtype = DType::kF32;
  } else {
    options.backend.device = DeviceKind::kCuda;
    options.backend.activation_dtype = activation;
  }
  return options;
}

const std::vector<Generation>& cpu_float32() {
  ModelLoadOptions options;
  options.dtype = DType::kF32;  // float32 weights too, not the checkpoint's bf16
  static const std::vector<Generation> results = generate(options, PoolSizing::kKvCacheMemoryGib);
  return results;
}

// The rank of `token` in a position's top logprobs (0 = first), or -1.
int rank_in(const SampledTokenLogprobs& position, int32_t token) {
  for (size_t r = 0; r < position.top.size(); ++r) {
    if (position.top[r].token == token) return static_cast<int>(r);
  }
  return -1;
}

float top2_margin(const SampledTokenLogprobs& position) {
  return position.top.size() >= 2 ? position.top[0].logprob - position.top[1].logprob : 0.0f;
}

size_t first_difference(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

TEST(FullDepthEngine, StrictFloat32GivesTheCpuGreedyIds) {
  const std::vector<Generation>& reference = cpu_float32();
  // The serving default on CUDA: the pool from --gpu-memory-utilization (0.90).
  const std::vector<Generation> device =
      generate(device_options(DType::kF32),
               gpu_test::on_cpu() ? PoolSizing::kKvCacheMemoryGib : PoolSizing::kDefault);
  ASSERT_EQ(device.size(), reference.size());
  for (size_t p = 0; p < reference.size(); ++p) {
    const size_t at = first_difference(device[p].tokens, reference[p].tokens);
    if (at == reference[p].tokens.size()) {
      std::printf("  prompt %zu: %zu of %d greedy ids equal\n", p, at, kNewTokens);
      continue;
    }
    ASSERT_LT(at, device[p].tokens.size());
    ASSERT_LT(at, reference[p].logprobs.size());
    const SampledTokenLogprobs& cpu = reference[p].logprobs[at];
    const float margin = top2_margin(cpu);
    std::printf(
        "  prompt %zu: ids differ from position %zu: CPU %d (top-2 margin %.3g), device %d "
        "(its rank there on the CPU: %d)\n",
        p, at, reference[p].tokens[at], margin, device[p].tokens[at],
        rank_in(cpu, device[p].tokens[at]));
    EXPECT_LE(margin, kTieMargin) << "prompt " << p << " position " << at
                                  << ": strict float32 left the CPU's ids where they were not tied";
    EXPECT_EQ(rank_in(cpu, device[p].tokens[at]), 1) << "prompt " << p << " position " << at;
  }
}

TEST(FullDepthEngine, Bf16IsReportedAgainstTheCpuCuda) {
  PDS_REQUIRE_CUDA();
  const std::vector<Generation>& reference = cpu_float32();
  // --kv-cache-memory-gib given on CUDA sizes the pool instead of the utilization.
  const std::vector<Generation> device =
      generate(device_options(DType::kBF16), PoolSizing::kKvCacheMemoryGib);
  ASSERT_EQ(device.size(), reference.size());
  for (size_t p = 0; p < reference.size(); ++p) {
    const size_t at = first_difference(device[p].tokens, reference[p].tokens);
    if (at == reference[p].tokens.size()) {
      std::printf("  bf16 prompt %zu: all %d greedy ids equal the CPU's float32 ids\n", p,
                  kNewTokens);
      continue;
    }
    ASSERT_LT(at, device[p].tokens.size());
    const SampledTokenLogprobs& cpu = reference[p].logprobs[at];
    const SampledTokenLogprobs& own = device[p].logprobs[at];
    const int rank = rank_in(cpu, device[p].tokens[at]);
    std::printf(
        "  bf16 prompt %zu: %zu ids equal, then CPU %d (CPU top-2 margin %.4f) vs bf16 %d "
        "(bf16 top-2 margin %.4f; its rank on the CPU %d; CPU logprob gap to it %.4f)\n",
        p, at, reference[p].tokens[at], top2_margin(cpu), device[p].tokens[at], top2_margin(own),
        rank, rank >= 0 ? cpu.top[0].logprob - cpu.top[static_cast<size_t>(rank)].logprob : -1.0f);
    EXPECT_GE(rank, 0) << "prompt " << p << " position " << at
                       << ": bf16 picked a token outside the CPU's top " << kTopLogprobs;
  }
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  return pdserve::gpu_test::run_main(argc, argv);
}
