// The engine's CUDA path on a device (label gpu; without a device it prints "SKIPPED: no CUDA
// device" and exits 77):
//  * CudaSampler: the sampling kernel (kernels/sampling_cuda.cu) on random full-vocabulary
//    rows and parameters against the host Sampler, by the rule of tests/kernels/
//    sampling_check.h: greedy, scripted and errors exact, sampled tokens the host's for the same
//    u except within rounding of a boundary; grammar masks; rows packed by the production
//    packer.
//  * CudaRunner: Qwen3ModelRunner on a synthetic model. Tokens sampled on the device for a
//    step are the host Sampler's on the logits the same step gives execute() (greedy exactly),
//    through decode graphs of several batch and context buckets and prefill chunks; the pool
//    sized from --gpu-memory-utilization stays within its budget; an LlmEngine whose thread is
//    not the one that made the runner (bind_current_thread) serves requests.
//    CudaRunnerStrictFloat32 repeats the token check in strict float32 (float32 graphs, KV).
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <future>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/engine/llm_engine.h"
#include "common/engine/sequence.h"
#include "common/model/checkpoint.h"
#include "common/model/qwen3_weights.h"
#include "common/model/synthetic_checkpoint.h"
#include "common/sampling/sampler.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/backend.h"
#include "kernels/cuda_device.h"
#include "kernels/model/model_runner.h"
#include "kernels/model/sampling_inputs.h"
#include "tests/kernels/sampling_check.h"
#include "tests/kernels_gpu/gpu_test_main.h"
#ifdef PDSERVE_WITH_CUDA
#include "kernels/cuda_backend.h"
#include "kernels/sampling_cuda.h"
#endif

namespace pdserve {
namespace {

#ifdef PDSERVE_WITH_CUDA

constexpr int kQwenVocab = 151936;

std::unique_ptr<Backend> cuda_backend(DType activation = DType::kBF16) {
  BackendOptions options;
  options.device = DeviceKind::kCuda;
  options.activation_dtype = activation;
  return std::move(create_backend(options)).value();
}

std::vector<float> gumbel_row(size_t vocab, uint64_t seed, float scale) {
  SamplerRng rng(seed);
  std::vector<float> row(vocab);
  for (float& logit : row) {
    const double u = (static_cast<double>(rng.next_u64() >> 11) + 0.5) * 0x1.0p-53;
    logit = static_cast<float>(-scale * std::log(-std::log(u)));
  }
  return row;
}

struct Case {
  std::vector<float> logits;
  SamplingParams params;
  std::vector<int32_t> prompt, output, banned, mask;
  uint64_t seed = 0;
};

Case random_case(uint32_t n) {
  std::mt19937 rng(n);
  const auto chance = [&](double p) { return std::uniform_real_distribution<>(0, 1)(rng) < p; };
  const auto token = [&] { return static_cast<int32_t>(rng() % kQwenVocab); };
  Case c;
  c.seed = rng();
  c.logits = gumbel_row(kQwenVocab, c.seed, chance(0.5) ? 1.0f : 3.0f);
  if (chance(0.1)) {  // ties at the top: many tokens share the largest logit
    for (int i = 0; i < 50; ++i) c.logits[static_cast<size_t>(token())] = 30.0f;
  }
  SamplingParams& p = c.params;
  p.temperature = chance(0.25) ? 0.0f : std::uniform_real_distribution<float>(0.3f, 1.3f)(rng);
  if (chance(0.5)) p.top_k = 1 + static_cast<int>(rng() % 100);
  if (chance(0.5)) p.top_p = std::uniform_real_distribution<float>(0.1f, 0.99f)(rng);
  if (chance(0.3)) p.min_p = std::uniform_real_distribution<float>(0.0f, 0.2f)(rng);
  if (chance(0.3)) p.repetition_penalty = std::uniform_real_distribution<float>(0.8f, 1.4f)(rng);
  if (chance(0.3)) p.frequency_penalty = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
  if (chance(0.3)) p.presence_penalty = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
  for (int i = 0, n_prompt = static_cast<int>(rng() % 300); i < n_prompt; ++i)
    c.prompt.push_back(token());
  for (int i = 0, n_out = static_cast<int>(rng() % 60); i < n_out; ++i) c.output.push_back(token());
  if (chance(0.2)) c.banned = {151643, 151645};
  if (chance(0.2))
    p.logit_bias = {{token(), 5.0f}, {static_cast<int32_t>(rng() % 1000 + 151000), -3.0f}};
  if (p.logit_bias.size() == 2 && p.logit_bias[0].token == p.logit_bias[1].token)
    p.logit_bias.pop_back();
  if (chance(0.05)) p.scripted_output = std::vector<int32_t>(c.output.size() + 1, 42);
  if (chance(0.2)) {  // a grammar allowing a random tenth of the vocabulary
    c.mask.assign((kQwenVocab + 31) / 32, 0);
    for (int i = 0; i < kQwenVocab / 10; ++i) {
      const int32_t t = token();
      c.mask[static_cast<size_t>(t) / 32] |= static_cast<int32_t>(1u << (t % 32));
    }
  }
  return c;
}

TEST(CudaSampler, RandomRowsFollowTheHostSampler) {
  std::unique_ptr<Backend> cuda = cuda_backend();
  const cudaStream_t stream = cuda_stream_of(*cuda).value();
  constexpr int kRows = 48;
  constexpr int kBatches = 8;
  const size_t vocab = kQwenVocab;
  const size_t words = (vocab + 31) / 32;
  const size_t list_ints = 1 << 16;
  DeviceBuffer logits = std::move(cuda->allocate(kRows * vocab * sizeof(float))).value();
  DeviceBuffer inputs = std::move(cuda->allocate(sampling_input_bytes(kRows, list_ints))).value();
  DeviceBuffer masks = std::move(cuda->allocate((kRows + kRows * words) * 4)).value();
  DeviceBuffer results = std::move(cuda->allocate(kRows * sizeof(sampling::RowResult))).value();
  std::vector<std::byte> area(sampling_input_bytes(kRows, list_ints));
  SamplingInputPacker packer(kQwenVocab);
  Sampler sampler;
  int sampled = 0, relaxed = 0, greedy = 0;
  for (int b = 0; b < kBatches; ++b) {
    std::vector<Case> cases;
    std::vector<SamplerRng> rngs;
    std::vector<SamplingRow> rows;
    std::vector<int32_t> logits_rows(kRows);
    std::vector<float> host_logits;
    std::vector<int32_t> mask_staging(kRows + kRows * words, -1);
    int masked_rows = 0;
    for (int r = 0; r < kRows; ++r) {
      cases.push_back(random_case(static_cast<uint32_t>(b * kRows + r)));
      rngs.emplace_back(cases.back().seed);
      // Rows in reverse order in the logits buffer: row r reads logits row kRows - 1 - r.
      logits_rows[static_cast<size_t>(r)] = kRows - 1 - r;
    }
    for (int r = kRows - 1; r >= 0; --r) {
      host_logits.insert(host_logits.end(), cases[static_cast<size_t>(r)].logits.begin(),
                         cases[static_cast<size_t>(r)].logits.end());
    }
    for (int r = 0; r < kRows; ++r) {
      const Case& c = cases[static_cast<size_t>(r)];
      rows.push_back({&c.params, c.prompt, c.output, c.banned, &rngs[static_cast<size_t>(r)]});
      if (!c.mask.empty()) {
        mask_staging[static_cast<size_t>(r)] = masked_rows;
        std::copy(c.mask.begin(), c.mask.end(),
                  mask_staging.begin() + kRows + static_cast<ptrdiff_t>(masked_rows * words));
        ++masked_rows;
      }
    }
    std::vector<SampleOutcome> outcomes(kRows);
    const PackedSampling packed = packer.pack(rows, logits_rows, area, outcomes).value();
    ASSERT_TRUE(
        cuda->copy_to_device(logits.data(), host_logits.data(), host_logits.size() * 4).ok());
    ASSERT_TRUE(cuda->copy_to_device(inputs.data(), area.data(), packed.bytes).ok());
    ASSERT_TRUE(
        cuda->copy_to_device(masks.data(), mask_staging.data(), mask_staging.size() * 4).ok());
    cuda::SampleRowsArgs args;
    args.logits = logits.as<float>();
    args.logits_stride = kQwenVocab;
    args.vocab = kQwenVocab;
    args.rows = inputs.as<sampling::RowArgs>();
    args.num_rows = kRows;
    args.lists = reinterpret_cast<const int32_t*>(inputs.as<std::byte>() + packed.lists_offset);
    args.mask_index = masks.as<int32_t>();
    args.masks = masks.as<int32_t>() + kRows;
    args.mask_words = static_cast<int>(words);
    args.results = results.as<sampling::RowResult>();
    ASSERT_EQ(cuda::sample_rows(args, stream), cudaSuccess);
    std::vector<sampling::RowResult> got(kRows);
    ASSERT_TRUE(cuda->copy_to_host(got.data(), results.data(), got.size() * sizeof(got[0])).ok());
    ASSERT_TRUE(cuda->synchronize().ok());
    const auto* args_host = reinterpret_cast<const sampling::RowArgs*>(area.data());
    for (int r = 0; r < kRows; ++r) {
      const Case& c = cases[static_cast<size_t>(r)];
      ASSERT_EQ(outcomes[static_cast<size_t>(r)], SampleOutcome::kSampled);
      std::vector<float> masked = c.logits;
      apply_token_bitmask(c.mask, masked);
      const double unit = args_host[r].unit;
      const Result<SampleResult> host =
          sampler.sample_with_unit(masked, c.params, c.prompt, c.output, unit, c.banned);
      if (!host.ok()) {
        EXPECT_NE(got[static_cast<size_t>(r)].status, sampling::kRowOk) << "row " << r;
        continue;
      }
      ASSERT_EQ(got[static_cast<size_t>(r)].status, sampling::kRowOk)
          << "batch " << b << " row " << r;
      const int32_t token = got[static_cast<size_t>(r)].token;
      if (!sampler_draws(c.params, c.output.size())) {
        EXPECT_EQ(token, host->token) << "greedy/scripted batch " << b << " row " << r;
        ++greedy;
        continue;
      }
      ++sampled;
      bool exact = false;
      EXPECT_TRUE(testing::acceptable_sample(sampler, masked, c.params, c.prompt, c.output,
                                             c.banned, unit, token, exact))
          << "batch " << b << " row " << r << ": token " << token << ", host " << host->token;
      relaxed += exact ? 0 : 1;
    }
  }
  std::printf("  %d greedy/scripted rows exact, %d sampled rows, %d by the boundary rule\n", greedy,
              sampled, relaxed);
  EXPECT_LE(relaxed, sampled / 50 + 1);
}

TEST(CudaSampler, ErrorsAreReportedPerRow) {
  std::unique_ptr<Backend> cuda = cuda_backend();
  const cudaStream_t stream = cuda_stream_of(*cuda).value();
  constexpr int kVocab = 1000;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams penalized = greedy;
  penalized.repetition_penalty = 0.5f;
  const std::vector<int32_t> prompt = {7};
  std::vector<SamplerRng> rngs(3, SamplerRng(1));
  const std::vector<SamplingRow> rows = {{&greedy, {}, {}, {}, &rngs[0]},
                                         {&greedy, {}, {}, {}, &rngs[1]},
                                         {&penalized, prompt, {}, {}, &rngs[2]}};
  std::vector<float> host(3 * kVocab, 0.0f);
  host[5] = std::nanf("");  // row 0: NaN
  for (int i = 0; i < kVocab; ++i) host[kVocab + i] = -std::numeric_limits<float>::infinity();
  host[2 * kVocab + 7] = 3e38f;  // row 2: overflows to +inf
  std::vector<std::byte> area(sampling_input_bytes(3, 64));
  std::vector<SampleOutcome> outcomes(3);
  SamplingInputPacker packer(kVocab);
  const std::vector<int32_t> logits_rows = {0, 1, 2};
  const PackedSampling packed = packer.pack(rows, logits_rows, area, outcomes).value();
  DeviceBuffer logits = std::move(cuda->allocate(host.size() * 4)).value();
  DeviceBuffer inputs = std::move(cuda->allocate(area.size())).value();
  DeviceBuffer results = std::move(cuda->allocate(3 * sizeof(sampling::RowResult))).value();
  ASSERT_TRUE(cuda->copy_to_device(logits.data(), host.data(), host.size() * 4).ok());
  ASSERT_TRUE(cuda->copy_to_device(inputs.data(), area.data(), packed.bytes).ok());
  cuda::SampleRowsArgs args;
  args.logits = logits.as<float>();
  args.logits_stride = kVocab;
  args.vocab = kVocab;
  args.rows = inputs.as<sampling::RowArgs>();
  args.num_rows = 3;
  args.lists = reinterpret_cast<const int32_t*>(inputs.as<std::byte>() + packed.lists_offset);
  args.results = results.as<sampling::RowResult>();
  ASSERT_EQ(cuda::sample_rows(args, stream), cudaSuccess);
  std::vector<sampling::RowResult> got(3);
  ASSERT_TRUE(cuda->copy_to_host(got.data(), results.data(), got.size() * sizeof(got[0])).ok());
  EXPECT_EQ(got[0].status, sampling::kRowInvalidLogits);
  EXPECT_EQ(got[1].status, sampling::kRowAllMasked);
  EXPECT_EQ(got[2].status, sampling::kRowPenaltyOverflow);
}
// A synthetic 2-layer model of the head_dim-64 GQA shape, on the CUDA backend in bf16.
class CudaRunner : public ::testing::Test {
 protected:
  // What the backend computes in (and the model's weights): bf16, the CUDA default.
  virtual DType activation() const { return DType::kBF16; }

  void SetUp() override {
    out_dir_ = gpu_test::write_test_model("tests/data/reference/configs/hd64_gqa4.json",
                                          "cuda-runner", 2, 0);
    Checkpoint checkpoint = Checkpoint::open(out_dir_).value();
    cuda_ = cuda_backend(activation());
    model_ =
        std::move(Qwen3Model::create(*cuda_, load_qwen3_weights(checkpoint, activation()).value()))
            .value();
    ASSERT_EQ(model_->weight_dtype(), activation());
  }
  void TearDown() override { std::filesystem::remove_all(out_dir_); }

  std::filesystem::path out_dir_;
  std::unique_ptr<Backend> cuda_;
  std::unique_ptr<Qwen3Model> model_;
};

// The same in strict float32 (--dtype float32): float32 weights, activations, KV and graphs.
class CudaRunnerStrictFloat32 : public CudaRunner {
 protected:
  DType activation() const override { return DType::kF32; }
};

Sequence make_sequence(SeqId id, std::vector<int32_t> prompt, const SamplingParams& params,
                       int vocab) {
  StopChecker stop = StopChecker::create(params, {}, vocab).value();
  return Sequence(id, std::move(prompt), params, std::move(stop), static_cast<uint64_t>(id),
                  std::chrono::steady_clock::now());
}

// For 40 steps of 3 sequences (prefill chunks, decode graphs of two batch and two context
// buckets), the tokens the runner samples on the device are the host Sampler's on the logits
// execute() gives for the same step; KV in the activation dtype.
void expect_device_tokens_follow_the_host_sampler(Backend& cuda, Qwen3Model& model,
                                                  DType kv_dtype) {
  const int vocab = model.config().vocab_size;
  ModelRunnerConfig config;
  config.num_blocks = 200;
  config.block_size = 16;
  config.kv_dtype = kv_dtype;
  config.limits.max_num_tokens = 256;
  config.limits.max_num_seqs = 8;
  config.limits.max_model_len = 2048;  // context buckets 1024 and 2048
  std::unique_ptr<Qwen3ModelRunner> runner =
      std::move(Qwen3ModelRunner::create(cuda, model, config)).value();
  ASSERT_TRUE(runner->samples_on_device());
  EXPECT_EQ(runner->num_decode_graphs(), 4 * 2);  // batches 1, 2, 4, 8 x contexts 1024, 2048
  EXPECT_EQ(runner->schedulable_blocks(), 199);

  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.ignore_eos = true;
  greedy.max_tokens = 2000;
  SamplingParams sampled = greedy;
  sampled.temperature = 0.8f;
  sampled.top_k = 50;
  sampled.top_p = 0.9f;
  sampled.repetition_penalty = 1.1f;
  // Three sequences; the third's prompt is long enough to move into the 2048 bucket.
  std::vector<Sequence> seqs;
  std::mt19937 rng(4);
  const std::vector<int> prompt_lengths = {5, 40, 1100};
  for (int s = 0; s < 3; ++s) {
    std::vector<int32_t> prompt(static_cast<size_t>(prompt_lengths[static_cast<size_t>(s)]));
    for (int32_t& id : prompt) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
    seqs.push_back(make_sequence(s, std::move(prompt), s == 1 ? sampled : greedy, vocab));
  }
  // Each sequence's blocks for its prompt and up to 40 outputs: 4, 8 and 88 blocks, disjoint.
  std::vector<std::vector<int32_t>> tables = {std::vector<int32_t>(4), std::vector<int32_t>(8),
                                              std::vector<int32_t>(88)};
  std::iota(tables[0].begin(), tables[0].end(), 0);
  std::iota(tables[1].begin(), tables[1].end(), 4);
  std::iota(tables[2].begin(), tables[2].end(), 12);
  std::vector<SamplerRng> rngs(3, SamplerRng(11));
  Sampler sampler;
  std::vector<float> host_logits(3 * static_cast<size_t>(vocab));
  std::vector<float> fetched(3 * static_cast<size_t>(vocab));
  int compared = 0;
  for (uint64_t step = 1; step <= 40; ++step) {
    // Sequences 0 and 1 alone first (decode graphs of batch 2, context bucket 1024), then the
    // long one joins (prefill chunks, then batch 4, context bucket 2048).
    const int active = step <= 12 ? 2 : 3;
    ScheduledBatch batch;
    batch.step = step;
    for (int s = 0; s < active; ++s) {
      Sequence& seq = seqs[static_cast<size_t>(s)];
      ScheduledSequence entry;
      entry.sequence = &seq;
      entry.num_cached_before = seq.num_computed_tokens();
      entry.num_new_tokens = std::min(seq.num_uncomputed_tokens(), 100);  // prefill in chunks
      entry.samples = entry.num_cached_before + entry.num_new_tokens == seq.num_tokens();
      entry.block_table = tables[static_cast<size_t>(s)];
      batch.entries.push_back(entry);
      batch.num_samples += entry.samples ? 1 : 0;
      batch.num_batched_tokens += entry.num_new_tokens;
    }
    // The host path's logits for this step (writing the same KV the device step writes).
    ASSERT_TRUE(runner->execute(batch, host_logits, {}).ok());
    std::vector<SamplingRow> rows;
    std::vector<SamplerRng> before = rngs;
    std::vector<int> sampling_seqs;
    for (int s = 0; s < active; ++s) {
      if (!batch.entries[static_cast<size_t>(s)].samples) continue;
      const Sequence& seq = seqs[static_cast<size_t>(s)];
      rows.push_back({&seq.sampling_params(),
                      seq.prompt_tokens(),
                      seq.output_tokens(),
                      {},
                      &rngs[static_cast<size_t>(s)]});
      sampling_seqs.push_back(s);
    }
    std::vector<std::span<const int32_t>> masks(rows.size());
    std::vector<SampledRow> results(rows.size());
    ASSERT_TRUE(runner->launch_step(batch, rows, {}).ok());
    const Status sampled_status = runner->sample_step(masks, results, fetched);
    ASSERT_TRUE(sampled_status.ok()) << sampled_status.to_string();
    for (size_t r = 0; r < rows.size(); ++r) {
      const int s = sampling_seqs[r];
      Sequence& seq = seqs[static_cast<size_t>(s)];
      const std::span<const float> row(host_logits.data() + r * vocab, static_cast<size_t>(vocab));
      ASSERT_EQ(results[r].outcome, SampleOutcome::kSampled);
      SamplerRng unit_source = before[static_cast<size_t>(s)];
      const double unit = sampler_draws(seq.sampling_params(), seq.output_tokens().size())
                              ? unit_source.next_unit()
                              : 0.0;
      EXPECT_EQ(rngs[static_cast<size_t>(s)].state(), unit_source.state());
      bool exact = false;
      EXPECT_TRUE(testing::acceptable_sample(sampler, row, seq.sampling_params(),
                                             seq.prompt_tokens(), seq.output_tokens(), {}, unit,
                                             results[r].token, exact))
          << "step " << step << " sequence " << s;
      if (seq.sampling_params().temperature == 0.0f) {
        EXPECT_TRUE(exact) << "greedy is exact";
      }
      ++compared;
    }
    // Apply the step as the scheduler would.
    size_t r = 0;
    for (int s = 0; s < active; ++s) {
      const ScheduledSequence& entry = batch.entries[static_cast<size_t>(s)];
      Sequence& seq = seqs[static_cast<size_t>(s)];
      seq.set_num_computed_tokens(entry.num_cached_before + entry.num_new_tokens);
      if (entry.samples) seq.append_output_token(results[r++].token);
    }
  }
  EXPECT_GT(compared, 80);
}

TEST_F(CudaRunner, TokensSampledOnTheDeviceAreTheHostSamplersOnTheStepsLogits) {
  expect_device_tokens_follow_the_host_sampler(*cuda_, *model_, DType::kBF16);
}

TEST_F(CudaRunnerStrictFloat32, TokensSampledOnTheDeviceAreTheHostSamplersOnTheStepsLogits) {
  expect_device_tokens_follow_the_host_sampler(*cuda_, *model_, DType::kF32);
}

TEST_F(CudaRunner, ThePoolSizedFromUtilizationStaysInItsBudget) {
  ModelRunnerConfig config;
  config.block_size = 16;
  config.kv_dtype = DType::kBF16;
  config.limits.max_num_tokens = 512;
  config.limits.max_num_seqs = 16;
  config.limits.max_model_len = 4096;
  config.gpu_memory_utilization = 0.5;
  std::unique_ptr<Qwen3ModelRunner> runner =
      std::move(Qwen3ModelRunner::create(*cuda_, *model_, config)).value();
  const GpuMemoryReport report = runner->memory_report().value();
  std::printf("  %s\n", describe_gpu_memory(report).c_str());
  EXPECT_EQ(report.num_blocks, runner->kv_cache().layout().num_blocks);
  EXPECT_EQ(runner->schedulable_blocks(), report.num_blocks - 1);
  const CudaMemoryInfo after = cuda_memory_info(*cuda_).value();
  const size_t in_use = after.total_bytes - after.free_bytes;
  // Everything this process and others hold, KV pool included, within the budget (1% slack for
  // what the driver rounds up).
  EXPECT_LE(static_cast<double>(in_use), 1.01 * static_cast<double>(report.budget_bytes));
  EXPECT_GE(static_cast<double>(in_use), 0.9 * static_cast<double>(report.budget_bytes));
  config.gpu_memory_utilization = 1e-4;
  EXPECT_EQ(Qwen3ModelRunner::create(*cuda_, *model_, config).status().code(),
            StatusCode::kResourceExhausted);
}

TEST_F(CudaRunner, AnEngineOnItsOwnThreadServesRequests) {
  ModelRunnerConfig config;
  config.num_blocks = 64;
  config.block_size = 16;
  config.kv_dtype = DType::kBF16;
  config.limits.max_num_tokens = 64;
  config.limits.max_num_seqs = 4;
  config.limits.max_model_len = 256;
  std::unique_ptr<Qwen3ModelRunner> runner =
      std::move(Qwen3ModelRunner::create(*cuda_, *model_, config)).value();
  LlmEngineConfig engine;
  engine.scheduler.num_blocks = runner->schedulable_blocks();
  engine.scheduler.block_size = 16;
  engine.scheduler.max_num_batched_tokens = 64;
  engine.scheduler.max_num_seqs = 4;
  engine.scheduler.max_model_len = 256;
  engine.scheduler.vocab_size = model_->config().vocab_size;
  engine.scheduler.eos_token_ids = {151645};
  engine.model_name = "synthetic";
  Tokenizer tokenizer = Tokenizer::from_model_dir(out_dir_).value();
  std::unique_ptr<LlmEngine> llm =
      std::move(LlmEngine::create(std::move(runner), std::move(tokenizer), engine)).value();
  ASSERT_TRUE(llm->start().ok());
  std::vector<std::future<SequenceDelta>> finals;
  std::vector<std::shared_ptr<std::promise<SequenceDelta>>> promises;
  for (int r = 0; r < 6; ++r) {
    InferenceRequest request;
    request.id = "r" + std::to_string(r);
    request.prompt_tokens = {static_cast<int32_t>(100 + r), 200, 300};
    request.sampling.max_tokens = 20;
    request.sampling.ignore_eos = true;
    request.sampling.temperature = r % 2 == 0 ? 0.0f : 0.7f;
    request.sampling.seed = 5;
    auto promise = std::make_shared<std::promise<SequenceDelta>>();
    finals.push_back(promise->get_future());
    ASSERT_TRUE(llm->submit(std::move(request),
                            [promise](SequenceDelta delta) {
                              if (delta.finished) promise->set_value(std::move(delta));
                            })
                    .ok());
  }
  for (std::future<SequenceDelta>& final_delta : finals) {
    ASSERT_EQ(final_delta.wait_for(std::chrono::seconds(120)), std::future_status::ready);
    const SequenceDelta delta = final_delta.get();
    EXPECT_TRUE(delta.error.ok()) << delta.error.to_string();
    EXPECT_EQ(delta.completion_tokens, 20);
  }
  llm->stop();
}

#endif  // PDSERVE_WITH_CUDA

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  return pdserve::gpu_test::run_main(argc, argv, pdserve::gpu_test::CpuStandIn::kNever);
}
