// Per-layer completion (issue #14 item 2): Qwen3Model reports each layer to the forward's
// observer once that layer's KV is in the pool, in order, before the forward returns. On the
// CPU backend that is right after the layer's KV write (the next layer's KV is not written
// yet); on an asynchronous backend it is when the device has passed the marker recorded after
// the write. The asynchronous case runs here on a CPU backend whose markers are "reached" only
// after some polls, as a GPU's events are: layers are then reported while later layers are
// still being queued, never before their marker is reached, and the logits do not change.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <vector>

#include "common/model/checkpoint.h"
#include "common/model/qwen3_weights.h"
#include "common/model/synthetic_checkpoint.h"
#include "kernels/model/qwen3_model.h"

namespace pdserve {
namespace {

constexpr int kLayers = 4;
constexpr int kBlockSize = 16;

// A CPU backend (the work is done when a call returns) whose markers are reached only after
// `polls_until_reached` polls since they were recorded, and which logs every event in order.
class DeferredMarkerBackend final : public Backend {
 public:
  DeferredMarkerBackend(std::unique_ptr<Backend> cpu, int polls_until_reached)
      : cpu_(std::move(cpu)), polls_until_reached_(polls_until_reached) {}

  std::vector<std::string> log;  // "write L", "record L", "reached L"
  std::map<int, bool> reached;   // what marker_reached last answered
  Status fail_polls = Status::ok_status();

  // Not the CPU: the forward must not take the kind for the way layers are reported.
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string description() const override {
    return "deferred markers over " + cpu_->description();
  }
  DType activation_dtype() const override { return cpu_->activation_dtype(); }
  bool shares_host_memory() const override { return cpu_->shares_host_memory(); }
  Result<DeviceBuffer> allocate(size_t bytes) override {
    PDS_ASSIGN_OR_RETURN(DeviceBuffer buffer, cpu_->allocate(bytes));
    // Owned by the inner backend (it frees it); this one only hands it on.
    return buffer;
  }
  void release(void* data) noexcept override { cpu_->release(data); }
  Status copy_to_device(void* dst, const void* src, size_t bytes) override {
    return cpu_->copy_to_device(dst, src, bytes);
  }
  Status copy_to_host(void* dst, const void* src, size_t bytes) override {
    return cpu_->copy_to_host(dst, src, bytes);
  }
  Status synchronize() override { return cpu_->synchronize(); }

  Status record_marker(int marker) override {
    log.push_back("record " + std::to_string(marker));
    polls_[marker] = 0;
    reached[marker] = false;
    return Status::ok_status();
  }
  Result<bool> marker_reached(int marker) override {
    if (!fail_polls.ok()) return fail_polls;
    const bool now = ++polls_[marker] > polls_until_reached_;
    if (now && !reached[marker]) log.push_back("reached " + std::to_string(marker));
    reached[marker] = now;
    return now;
  }

  Status embedding(MatrixView table, const int32_t* ids, MatrixView out) override {
    return cpu_->embedding(table, ids, out);
  }
  Status rms_norm(MatrixView in, VectorView weight, float eps, MatrixView out) override {
    return cpu_->rms_norm(in, weight, eps, out);
  }
  Status add_rms_norm(MatrixView x, MatrixView residual, VectorView weight, float eps) override {
    return cpu_->add_rms_norm(x, residual, weight, eps);
  }
  Status linear(MatrixView in, MatrixView weight, MatrixView out) override {
    return cpu_->linear(in, weight, out);
  }
  Status qk_norm_rope_kv_write(MatrixView q, MatrixView k, MatrixView v,
                               const QkNormRopeParams& params, const AttentionBatch& batch,
                               const KvCacheView& cache, int layer) override {
    log.push_back("write " + std::to_string(layer));
    return cpu_->qk_norm_rope_kv_write(q, k, v, params, batch, cache, layer);
  }
  Status paged_attention(MatrixView q, const AttentionBatch& batch, const KvCacheView& cache,
                         int layer, int num_heads, float scale, MatrixView out) override {
    return cpu_->paged_attention(q, batch, cache, layer, num_heads, scale, out);
  }
  Status silu_mul(MatrixView gate, MatrixView up, MatrixView out) override {
    return cpu_->silu_mul(gate, up, out);
  }
  Status gather_rows(MatrixView in, const int32_t* indices, MatrixView out) override {
    return cpu_->gather_rows(in, indices, out);
  }

 private:
  std::unique_ptr<Backend> cpu_;
  int polls_until_reached_;
  std::map<int, int> polls_;
};

class LayerMarkers : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    SyntheticCheckpointOptions options;
    options.config_path =
        std::filesystem::path(PDSERVE_SOURCE_DIR) / "tests/data/reference/configs/tiny.json";
    options.out_dir = std::filesystem::path(PDSERVE_BINARY_DIR) / "test-models" /
                      ("layer-markers-" + std::to_string(::getpid()));
    options.seed = 3;
    options.num_layers = kLayers;
    options.dtype = DType::kF32;
    options.tokenizer_dir = std::filesystem::path(PDSERVE_ASSETS_DIR) / "qwen3-tokenizer";
    Result<SyntheticCheckpoint> written = write_synthetic_checkpoint(options);
    ASSERT_TRUE(written.ok()) << written.status().to_string();
    checkpoint_dir_ = new std::filesystem::path(options.out_dir);
  }
  static void TearDownTestSuite() {
    std::error_code ignored;
    std::filesystem::remove_all(*checkpoint_dir_, ignored);
    delete checkpoint_dir_;
  }

  // The logits of one prompt on `backend`, with `observer` if set; the pool is NaN-poisoned
  // first, so an observer can tell which layers' KV is written.
  std::vector<float> run(Backend& backend, const std::function<void(int)>& observer,
                         Status* status_out = nullptr) {
    Checkpoint checkpoint = Checkpoint::open(*checkpoint_dir_).value();
    Qwen3Weights weights = load_qwen3_weights(checkpoint, DType::kF32).value();
    model_ = Qwen3Model::create(backend, std::move(weights)).value();
    const ModelConfig& config = model_->config();
    ForwardLimits limits;
    limits.max_num_tokens = 64;
    limits.max_num_seqs = 2;
    limits.max_model_len = 64;
    context_ = std::make_unique<ForwardContext>(
        ForwardContext::create(backend, config, limits, kBlockSize).value());
    cache_ = std::make_unique<KvCache>(
        KvCache::create(backend, kv_layout_for(config, 4, kBlockSize, DType::kF32)).value());
    float* pool = static_cast<float*>(cache_->data());
    std::fill(pool, pool + cache_->size_bytes() / sizeof(float),
              std::numeric_limits<float>::quiet_NaN());
    prompt_.resize(20);
    std::iota(prompt_.begin(), prompt_.end(), 100);
    const std::vector<SequenceSlice> slices = {{prompt_, 0, table_}};
    std::vector<float> logits(static_cast<size_t>(config.vocab_size));
    const Status status = model_->forward(slices, *cache_, *context_, logits, observer);
    if (status_out != nullptr) {
      *status_out = status;
    } else {
      EXPECT_TRUE(status.ok()) << status.to_string();
    }
    return logits;
  }

  // Frees what run() placed on its backend, before that backend goes.
  void release_model() {
    cache_.reset();
    context_.reset();
    model_.reset();
  }

  // Whether layer `layer`'s K of the prompt's first token is written (no longer NaN).
  bool layer_written(int layer) const {
    const auto* pool = static_cast<const std::byte*>(cache_->data());
    float first;
    std::memcpy(&first, pool + cache_->layout().offset(layer, table_[0], false), sizeof first);
    return !std::isnan(first);
  }

  static std::filesystem::path* checkpoint_dir_;
  std::unique_ptr<Qwen3Model> model_;
  std::unique_ptr<ForwardContext> context_;
  std::unique_ptr<KvCache> cache_;
  std::vector<int32_t> prompt_;
  const std::vector<int32_t> table_ = {2, 1};
};

std::filesystem::path* LayerMarkers::checkpoint_dir_ = nullptr;

TEST_F(LayerMarkers, TheCpuBackendReportsEachLayerRightAfterItsKvWrite) {
  std::unique_ptr<Backend> cpu = create_backend(BackendOptions{}).value();
  std::vector<int> reported;
  run(*cpu, [&](int layer) {
    EXPECT_EQ(layer, static_cast<int>(reported.size())) << "layers out of order";
    reported.push_back(layer);
    EXPECT_TRUE(layer_written(layer)) << "layer " << layer << " reported before its KV write";
    if (layer + 1 < kLayers) {
      EXPECT_FALSE(layer_written(layer + 1))
          << "layer " << layer << " reported only after the next layer's KV write";
    }
  });
  EXPECT_EQ(reported, std::vector<int>({0, 1, 2, 3}));
  release_model();
}

TEST_F(LayerMarkers,
       AnAsynchronousBackendReportsLayersAsTheirMarkersAreReachedAndAllBeforeReturning) {
  std::unique_ptr<Backend> reference_cpu = create_backend(BackendOptions{}).value();
  const std::vector<float> expected = run(*reference_cpu, {});
  release_model();
  for (const int polls : {0, 1, 1000}) {
    SCOPED_TRACE("markers reached after " + std::to_string(polls) + " polls");
    DeferredMarkerBackend backend(create_backend(BackendOptions{}).value(), polls);
    std::vector<int> reported;
    const std::vector<float> logits = run(backend, [&](int layer) {
      EXPECT_EQ(layer, static_cast<int>(reported.size())) << "layers out of order";
      EXPECT_TRUE(backend.reached[layer]) << "layer " << layer << " reported before its marker";
      reported.push_back(layer);
      backend.log.push_back("report " + std::to_string(layer));
    });
    EXPECT_EQ(reported, std::vector<int>({0, 1, 2, 3})) << "every layer, once, before returning";
    EXPECT_EQ(logits, expected) << "markers change nothing in the computation";
    // Each layer's marker is recorded right after its KV write.
    for (int layer = 0; layer < kLayers; ++layer) {
      const auto write =
          std::find(backend.log.begin(), backend.log.end(), "write " + std::to_string(layer));
      ASSERT_NE(write, backend.log.end());
      ASSERT_NE(write + 1, backend.log.end());
      EXPECT_EQ(*(write + 1), "record " + std::to_string(layer));
    }
    // A device that is quick enough lets the first layer go before the last one is queued:
    // that is the overlap layer-by-layer sending is for.
    const auto first_report = std::find(backend.log.begin(), backend.log.end(), "report 0");
    const auto last_write =
        std::find(backend.log.begin(), backend.log.end(), "write " + std::to_string(kLayers - 1));
    if (polls <= 1) {
      EXPECT_LT(first_report, last_write) << "layer 0 was reported only after the last write";
    } else {
      EXPECT_GT(first_report, last_write) << "a slow device's layers come after the queueing";
    }
    release_model();
  }
}

// The CUDA step path queues a step, polls its layers before the step's one wait
// (Qwen3ModelRunner::sample_step), and reports a graph's layers, which record no markers,
// after the wait.
TEST_F(LayerMarkers, AStepPathQueuesWithoutWaitingThenDrainsAndAGraphsLayersFollowTheWait) {
  DeferredMarkerBackend backend(create_backend(BackendOptions{}).value(), 1000);
  run(backend, {});  // places the model and the pool on this backend
  std::vector<int> reported;
  LayerProgress progress(
      backend, [&](int layer) { reported.push_back(layer); }, kLayers);
  const std::vector<SequenceSlice> slices = {{prompt_, 0, table_}};
  ASSERT_TRUE(model_->prepare_batch(slices, *cache_, *context_).ok());
  AttentionBatch batch;
  ASSERT_TRUE(model_->upload_batch(*context_, batch).ok());
  backend.log.clear();
  ASSERT_TRUE(model_->compute(batch, cache_->view(), *context_, &progress).ok());
  EXPECT_TRUE(reported.empty()) << "compute() waited for a marker";
  EXPECT_EQ(std::count_if(backend.log.begin(), backend.log.end(),
                          [](const std::string& e) { return e.rfind("record", 0) == 0; }),
            kLayers);
  ASSERT_TRUE(progress.poll().ok());
  EXPECT_TRUE(reported.empty()) << "a poll reported a layer the device is not past";
  ASSERT_TRUE(progress.drain().ok());
  EXPECT_EQ(reported, std::vector<int>({0, 1, 2, 3}));
  progress.finish_after_wait();
  EXPECT_EQ(reported.size(), 4u) << "nothing is reported twice";
  // A replayed graph records nothing: its layers come after the step's wait, in order.
  std::vector<int> after_wait;
  LayerProgress graph(
      backend, [&](int layer) { after_wait.push_back(layer); }, kLayers);
  ASSERT_TRUE(graph.drain().ok());
  EXPECT_TRUE(after_wait.empty());
  graph.finish_after_wait();
  EXPECT_EQ(after_wait, std::vector<int>({0, 1, 2, 3}));
  // Without an observer no marker is recorded.
  LayerProgress idle(backend, {}, kLayers);
  EXPECT_FALSE(idle.active());
  backend.log.clear();
  ASSERT_TRUE(model_->compute(batch, cache_->view(), *context_, &idle).ok());
  EXPECT_TRUE(std::none_of(backend.log.begin(), backend.log.end(),
                           [](const std::string& e) { return e.rfind("record", 0) == 0; }));
  release_model();
}

TEST_F(LayerMarkers, ADeviceErrorMetWhilePollingFailsTheForward) {
  DeferredMarkerBackend backend(create_backend(BackendOptions{}).value(), 5);
  backend.fail_polls = internal_error("the device fell over");
  int reported = 0;
  Status status;
  run(
      backend, [&](int) { ++reported; }, &status);
  EXPECT_EQ(status.code(), StatusCode::kInternal) << status.to_string();
  EXPECT_EQ(reported, 0);
  release_model();
}

}  // namespace
}  // namespace pdserve
