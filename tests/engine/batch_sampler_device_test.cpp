// The device-sampling path (ModelExecutor::samples_on_device, BatchSampler::sample_on_device)
// against the host path, both driven through EngineCore.
// Two executors produce the same pseudo-random logits (a function of the request and the step);
// one returns them for the host Sampler, the other "samples on its device" by the executor
// contract of common/engine/model_executor.h, emulated with the host Sampler: it draws u from
// the row's generator exactly when sampler_draws says, masks with the grammar bitmask it is
// given, returns raw logits rows only for logprobs and for rows it leaves to the host (every
// third row here), and reports NaN rows as kInvalidLogits. Every request must then stream the
// same tokens, text, logprobs, sampler states and finish, whichever path ran it: greedy,
// seeded sampling with top-k/top-p/min-p, penalties, logit_bias, min_tokens bans, logprobs,
// structured outputs and scripted outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "common/engine/engine_core.h"
#include "common/grammar/constraint.h"
#include "engine_test_util.h"

namespace pdserve {
namespace {

constexpr int kVocab = 151936;
constexpr int32_t kImEnd = 151645;
constexpr int32_t kEndOfText = 151643;
constexpr int32_t kNanRequest = 9999;  // a prompt starting with it gets a NaN logit

const Tokenizer& tokenizer() {
  static const Tokenizer loaded = Tokenizer::load(std::filesystem::path(PDSERVE_ASSETS_DIR) /
                                                  "qwen3-tokenizer" / "tokenizer.json")
                                      .value();
  return loaded;
}

// Logits of a sequence at a step: Gumbel noise seeded by the first prompt token and the
// number of output tokens, with a few text tokens lifted so that outputs are readable and EOS
// comes up sometimes.
void fill_logits(const Sequence& seq, std::span<float> out) {
  SamplerRng rng(static_cast<uint64_t>(seq.prompt_tokens()[0]) * 1000003u +
                 static_cast<uint64_t>(seq.num_output_tokens()));
  for (float& logit : out) {
    const double u = (static_cast<double>(rng.next_u64() >> 11) + 0.5) * 0x1.0p-53;
    logit = static_cast<float>(-std::log(-std::log(u)));
  }
  for (int32_t token = 32; token < 127; ++token) out[static_cast<size_t>(token)] += 4.0f;
  out[kImEnd] += 3.0f;
  if (seq.prompt_tokens()[0] == kNanRequest) out[5] = std::numeric_limits<float>::quiet_NaN();
}

class HostExecutor : public ModelExecutor {
 public:
  int vocab_size() const override { return kVocab; }
  Status execute(const ScheduledBatch& batch, std::span<float> logits,
                 const LayerKvWritten&) override {
    size_t row = 0;
    for (const ScheduledSequence& entry : batch.entries) {
      if (!entry.samples) continue;
      fill_logits(*entry.sequence, logits.subspan(row * kVocab, kVocab));
      ++row;
    }
    return Status::ok_status();
  }
};

class EmulatedDeviceExecutor : public HostExecutor {
 public:
  bool samples_on_device() const override { return true; }
  Status execute(const ScheduledBatch&, std::span<float>, const LayerKvWritten&) override {
    return internal_error("execute() called on a device-sampling executor");
  }
  Status launch_step(const ScheduledBatch& batch, std::span<const SamplingRow> rows,
                     const LayerKvWritten&) override {
    if (rows.size() != static_cast<size_t>(batch.num_samples)) {
      return internal_error("rows do not match the sampling entries");
    }
    rows_.assign(rows.begin(), rows.end());
    units_.assign(rows.size(), 0.0);
    left_to_host_.assign(rows.size(), false);
    logits_.assign(rows.size() * kVocab, 0.0f);
    size_t row = 0;
    for (const ScheduledSequence& entry : batch.entries) {
      if (!entry.samples) continue;
      fill_logits(*entry.sequence, std::span<float>(logits_).subspan(row * kVocab, kVocab));
      const SamplingRow& r = rows_[row];
      left_to_host_[row] = r.params != nullptr && ++rows_seen_ % 3 == 0;
      // The contract: u drawn exactly when the host sampler would, and not for a row left to
      // the host.
      if (r.params != nullptr && !left_to_host_[row] &&
          sampler_draws(*r.params, r.output_tokens.size())) {
        units_[row] = r.rng->next_unit();
      }
      ++row;
    }
    return Status::ok_status();
  }
  Status sample_step(std::span<const std::span<const int32_t>> allowed,
                     std::span<SampledRow> results, std::span<float> logits) override {
    for (size_t r = 0; r < rows_.size(); ++r) {
      const SamplingRow& row = rows_[r];
      if (row.params == nullptr) continue;
      const std::span<float> raw = std::span<float>(logits_).subspan(r * kVocab, kVocab);
      if (row.params->want_logprobs || left_to_host_[r]) {
        std::copy(raw.begin(), raw.end(), logits.begin() + static_cast<ptrdiff_t>(r * kVocab));
      }
      if (left_to_host_[r]) {
        results[r] = {SampleOutcome::kLeftToHost, 0};
        continue;
      }
      std::vector<float> masked(raw.begin(), raw.end());
      apply_token_bitmask(allowed[r], masked);
      const Result<SampleResult> sampled =
          sampler_.sample_with_unit(masked, *row.params, row.prompt_tokens, row.output_tokens,
                                    units_[r], row.banned_token_ids);
      results[r] = sampled.ok() ? SampledRow{SampleOutcome::kSampled, sampled->token}
                                : SampledRow{SampleOutcome::kInvalidLogits, 0};
    }
    return Status::ok_status();
  }

 private:
  Sampler sampler_;
  std::vector<SamplingRow> rows_;
  std::vector<double> units_;
  std::vector<bool> left_to_host_;
  std::vector<float> logits_;
  int rows_seen_ = 0;
};

SchedulerConfig config() {
  SchedulerConfig c;
  c.num_blocks = 256;
  c.block_size = 4;
  c.max_num_batched_tokens = 64;
  c.max_num_seqs = 8;
  c.max_num_waiting = 32;
  c.max_model_len = 256;
  c.vocab_size = kVocab;
  c.eos_token_ids = {kImEnd, kEndOfText};
  return c;
}

std::vector<InferenceRequest> requests() {
  std::vector<InferenceRequest> all;
  const auto base = [&](const std::string& id, int32_t first, int max_tokens) {
    InferenceRequest r;
    r.id = id;
    r.prompt_tokens = {first, 100, 101, 102, 103, 104};
    r.sampling.max_tokens = max_tokens;
    r.sampling.seed = static_cast<uint64_t>(first) * 7;
    r.report_sampler_state = true;
    return r;
  };
  InferenceRequest greedy = base("greedy", 11, 12);
  greedy.sampling.temperature = 0.0f;
  all.push_back(greedy);
  InferenceRequest sampled = base("sampled", 12, 16);
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.top_k = 20;
  sampled.sampling.top_p = 0.9f;
  all.push_back(sampled);
  InferenceRequest min_p = base("min_p", 13, 16);
  min_p.sampling.min_p = 0.05f;
  all.push_back(min_p);
  InferenceRequest penalized = base("penalized", 14, 20);
  penalized.sampling.repetition_penalty = 1.3f;
  penalized.sampling.frequency_penalty = 0.5f;
  penalized.sampling.presence_penalty = 0.4f;
  penalized.sampling.logit_bias = {{40, 3.0f}, {41, -100.0f}};
  all.push_back(penalized);
  InferenceRequest logprobs = base("logprobs", 15, 10);
  logprobs.sampling.want_logprobs = true;
  logprobs.sampling.logprobs = 5;
  logprobs.sampling.temperature = 0.7f;
  all.push_back(logprobs);
  InferenceRequest min_tokens = base("min_tokens", 16, 12);
  min_tokens.sampling.min_tokens = 8;
  min_tokens.sampling.temperature = 0.0f;
  all.push_back(min_tokens);
  InferenceRequest json = base("json", 17, 24);
  json.sampling.structured_output = StructuredOutput{
      StructuredOutput::Kind::kJsonSchema,
      R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})"};
  json.sampling.want_logprobs = true;
  json.sampling.logprobs = 2;
  all.push_back(json);
  InferenceRequest scripted = base("scripted", 18, 8);
  scripted.sampling.scripted_output = {72, 105, 33};
  scripted.sampling.temperature = 0.9f;
  all.push_back(scripted);
  InferenceRequest broken = base("nan", kNanRequest, 4);
  all.push_back(broken);
  return all;
}

std::map<std::string, testing::Stream> run(ModelExecutor& executor) {
  std::unique_ptr<EngineCore> core = EngineCore::create(config(), executor, tokenizer()).value();
  std::map<std::string, testing::Stream> streams;
  for (InferenceRequest& request : requests()) {
    const std::string id = request.id;
    const Status added = core->add(std::move(request), [&streams, id](SequenceDelta delta) {
      testing::Stream& stream = streams[id];
      if (delta.finished) ++stream.finals;
      stream.deltas.push_back(std::move(delta));
    });
    EXPECT_TRUE(added.ok()) << id << ": " << added.to_string();
  }
  for (int steps = 0; core->step(); ++steps) {
    if (steps > 1000) {
      ADD_FAILURE() << "the engine never idles";
      break;
    }
  }
  return streams;
}

TEST(EngineCoreDeviceSampling, EveryRequestStreamsWhatTheHostPathStreams) {
  HostExecutor host_executor;
  EmulatedDeviceExecutor device_executor;
  const std::map<std::string, testing::Stream> host = run(host_executor);
  const std::map<std::string, testing::Stream> device = run(device_executor);
  ASSERT_EQ(host.size(), requests().size());
  ASSERT_EQ(device.size(), host.size());
  for (const auto& [id, expected] : host) {
    const testing::Stream& got = device.at(id);
    EXPECT_EQ(got.finals, 1) << id;
    EXPECT_EQ(got.tokens(), expected.tokens()) << id;
    EXPECT_EQ(got.text(), expected.text()) << id;
    ASSERT_EQ(got.deltas.size(), expected.deltas.size()) << id;
    for (size_t d = 0; d < expected.deltas.size(); ++d) {
      const SequenceDelta& e = expected.deltas[d];
      const SequenceDelta& g = got.deltas[d];
      EXPECT_EQ(g.sampler_state, e.sampler_state) << id << " delta " << d;
      EXPECT_EQ(g.finish_reason, e.finish_reason) << id << " delta " << d;
      EXPECT_EQ(g.error.code(), e.error.code()) << id << " delta " << d;
      ASSERT_EQ(g.logprobs.size(), e.logprobs.size()) << id << " delta " << d;
      for (size_t k = 0; k < e.logprobs.size(); ++k) {
        EXPECT_EQ(g.logprobs[k].token, e.logprobs[k].token);
        EXPECT_EQ(g.logprobs[k].logprob, e.logprobs[k].logprob);
        ASSERT_EQ(g.logprobs[k].top.size(), e.logprobs[k].top.size());
        for (size_t t = 0; t < e.logprobs[k].top.size(); ++t) {
          EXPECT_EQ(g.logprobs[k].top[t].token, e.logprobs[k].top[t].token);
          EXPECT_EQ(g.logprobs[k].top[t].logprob, e.logprobs[k].top[t].logprob);
        }
      }
    }
  }
  // The workload exercised what it is for.
  EXPECT_FALSE(host.at("nan").last().error.ok());
  EXPECT_GE(host.at("min_tokens").tokens().size(), 8u);
  const std::vector<int32_t> scripted = host.at("scripted").tokens();
  ASSERT_GE(scripted.size(), 3u);
  EXPECT_EQ(std::vector<int32_t>(scripted.begin(), scripted.begin() + 3),
            (std::vector<int32_t>{72, 105, 33}));
  EXPECT_FALSE(host.at("logprobs").deltas.front().logprobs.empty());
  EXPECT_EQ(host.at("json").text().rfind("{\"a\":", 0), 0u) << host.at("json").text();
}

// A device sampler's error for the whole step fails every request of the batch, and each
// request still gets exactly one final delta.
class FailingDeviceExecutor : public EmulatedDeviceExecutor {
 public:
  Status sample_step(std::span<const std::span<const int32_t>>, std::span<SampledRow>,
                     std::span<float>) override {
    return internal_error("injected device failure");
  }
};

TEST(EngineCoreDeviceSampling, AFailedStepFailsItsRequestsOnce) {
  FailingDeviceExecutor executor;
  const std::map<std::string, testing::Stream> streams = run(executor);
  for (const auto& [id, stream] : streams) {
    EXPECT_EQ(stream.finals, 1) << id;
    EXPECT_FALSE(stream.last().error.ok()) << id;
  }
}

}  // namespace
}  // namespace pdserve
