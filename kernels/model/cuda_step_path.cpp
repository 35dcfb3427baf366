// The CUDA step path (device_step_path.h). Per step, on the backend's stream:
//   launch(): the batch arrays and the sampling rows in one copy from the forward context's
//             page-locked staging buffer; the decode graph's replay (or the eager forward);
//   sample(): the grammar masks in one copy when a row has one; the raw logits rows the host
//             needs (logprobs, rows left to it) into page-locked memory; the sampling kernel;
//             the tokens back; one wait (Backend::synchronize, which also reads the device
//             error word), then the results.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda_backend.h"
#include "kernels/cuda_check.h"
#include "kernels/model/device_step_path.h"
#include "kernels/model/gpu_graph_runner.h"
#include "kernels/model/sampling_inputs.h"
#include "kernels/sampling_cuda.h"

namespace pdserve {
namespace {

SampleOutcome outcome_of(int32_t status) {
  switch (status) {
    case sampling::kRowOk:
      return SampleOutcome::kSampled;
    case sampling::kRowInvalidLogits:
      return SampleOutcome::kInvalidLogits;
    case sampling::kRowAllMasked:
      return SampleOutcome::kAllMasked;
    case sampling::kRowPenaltyOverflow:
      return SampleOutcome::kPenaltyOverflow;
    default:
      return SampleOutcome::kInvalidLogits;
  }
}

class CudaStepPath final : public DeviceStepPath {
 public:
  static Result<std::unique_ptr<DeviceStepPath>> create(Backend& backend, Qwen3Model& model,
                                                        KvCache& cache, ForwardContext& context,
                                                        int scratch_block, bool cuda_graphs) {
    PDS_ASSIGN_OR_RETURN(cudaStream_t stream, cuda_stream_of(backend));
    const int vocab = model.config().vocab_size;
    const int max_rows = context.limits().max_num_seqs;
    std::unique_ptr<CudaStepPath> path(new CudaStepPath(backend, context, stream, vocab));
    PDS_ASSIGN_OR_RETURN(path->steps_, DecodeGraphRunner::create(backend, model, cache, context,
                                                                 scratch_block, cuda_graphs));
    path->mask_words_ = static_cast<int>((static_cast<size_t>(vocab) + 31) / 32);
    const size_t mask_bytes =
        (static_cast<size_t>(max_rows) + static_cast<size_t>(max_rows) * path->mask_words_) *
        sizeof(int32_t);
    PDS_ASSIGN_OR_RETURN(path->masks_device_, backend.allocate(mask_bytes));
    PDS_ASSIGN_OR_RETURN(path->masks_host_, backend.allocate_host(mask_bytes));
    const size_t result_bytes = static_cast<size_t>(max_rows) * sizeof(sampling::RowResult);
    PDS_ASSIGN_OR_RETURN(path->results_device_, backend.allocate(result_bytes));
    PDS_ASSIGN_OR_RETURN(path->results_host_, backend.allocate_host(result_bytes));
    return std::unique_ptr<DeviceStepPath>(std::move(path));
  }

  Status launch(std::span<const SequenceSlice> slices, std::span<const SamplingRow> rows,
                std::span<const int32_t> logits_rows) override {
    launched_ = false;
    if (rows.size() > static_cast<size_t>(context_.limits().max_num_seqs)) {
      return out_of_range("CUDA step: " + std::to_string(rows.size()) +
                          " sampling rows exceed max_num_seqs");
    }
    PDS_RETURN_IF_ERROR(steps_->prepare(slices).status());
    rows_.assign(rows.begin(), rows.end());
    logits_rows_.assign(logits_rows.begin(), logits_rows.end());
    outcomes_.assign(rows.size(), SampleOutcome::kSampled);
    PDS_ASSIGN_OR_RETURN(packed_,
                         packer_.pack(rows_, logits_rows_, context_.extra_inputs(), outcomes_));
    sampling_inputs_ = static_cast<std::byte*>(context_.device_extra_inputs());
    PDS_RETURN_IF_ERROR(steps_->launch(packed_.bytes));
    launched_ = true;
    return {};
  }

  Status sample(std::span<const std::span<const int32_t>> allowed, std::span<SampledRow> results,
                std::span<float> logits) override {
    if (!launched_) return failed_precondition("CUDA step: sample() without launch()");
    launched_ = false;
    const size_t num_rows = rows_.size();
    const size_t vocab = static_cast<size_t>(vocab_);
    if (allowed.size() != num_rows || results.size() != num_rows ||
        logits.size() < num_rows * vocab) {
      return invalid_argument("CUDA step: " + std::to_string(num_rows) + " rows, " +
                              std::to_string(allowed.size()) + " masks, " +
                              std::to_string(results.size()) + " results, " +
                              std::to_string(logits.size()) + " logits");
    }
    cuda::SampleRowsArgs args;
    args.logits = context_.device_logits();
    args.logits_stride = vocab_;
    args.vocab = vocab_;
    args.rows = reinterpret_cast<const sampling::RowArgs*>(sampling_inputs_);
    args.num_rows = static_cast<int>(num_rows);
    args.lists = reinterpret_cast<const int32_t*>(sampling_inputs_ + packed_.lists_offset);
    args.results = results_device_.as<sampling::RowResult>();
    PDS_RETURN_IF_ERROR(upload_masks(allowed, args));

    // The raw rows the host reads, queued before the kernel overwrites them.
    std::vector<size_t> fetched;
    for (size_t r = 0; r < num_rows; ++r) {
      const bool wants_logprobs = rows_[r].params != nullptr && rows_[r].params->want_logprobs;
      if (wants_logprobs || outcomes_[r] == SampleOutcome::kLeftToHost) fetched.push_back(r);
    }
    PDS_RETURN_IF_ERROR(reserve_fetched_rows(fetched.size()));
    for (size_t i = 0; i < fetched.size(); ++i) {
      PDS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
          fetched_host_.as<float>() + i * vocab,
          context_.device_logits() + static_cast<size_t>(logits_rows_[fetched[i]]) * vocab,
          vocab * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    }
    PDS_CUDA_RETURN_IF_ERROR(cuda::sample_rows(args, stream_));
    PDS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(results_host_.data(), results_device_.data(),
                                             num_rows * sizeof(sampling::RowResult),
                                             cudaMemcpyDeviceToHost, stream_));
    PDS_RETURN_IF_ERROR(backend_.synchronize());  // the step's one wait

    const auto* device_results = results_host_.as<sampling::RowResult>();
    for (size_t r = 0; r < num_rows; ++r) {
      if (outcomes_[r] == SampleOutcome::kLeftToHost) {
        results[r] = {SampleOutcome::kLeftToHost, 0};
        continue;
      }
      results[r] = {outcome_of(device_results[r].status), device_results[r].token};
      if (device_results[r].status == sampling::kRowBadList) {
        return internal_error("CUDA sampler: row " + std::to_string(r) +
                              " lists an id outside the vocabulary");
      }
    }
    for (size_t i = 0; i < fetched.size(); ++i) {
      std::memcpy(logits.data() + fetched[i] * vocab, fetched_host_.as<float>() + i * vocab,
                  vocab * sizeof(float));
    }
    return {};
  }

  Status forward(std::span<const SequenceSlice> slices, std::span<float> logits) override {
    launched_ = false;
    return steps_->forward(slices, logits);
  }

  int num_graphs() const override { return steps_->num_graphs(); }

 private:
  CudaStepPath(Backend& backend, ForwardContext& context, cudaStream_t stream, int vocab)
      : backend_(backend), context_(context), stream_(stream), vocab_(vocab), packer_(vocab) {}

  // The masks of the rows that have one, behind a per-row index, in one copy; none: no copy.
  Status upload_masks(std::span<const std::span<const int32_t>> allowed,
                      cuda::SampleRowsArgs& args) {
    const size_t num_rows = allowed.size();
    const size_t words = static_cast<size_t>(mask_words_);
    int32_t* index = masks_host_.as<int32_t>();
    int32_t* masks = index + context_.limits().max_num_seqs;
    int32_t count = 0;
    for (size_t r = 0; r < num_rows; ++r) {
      if (allowed[r].empty()) {
        index[r] = -1;
        continue;
      }
      if (allowed[r].size() != words) {
        return invalid_argument("CUDA step: row " + std::to_string(r) + " has a mask of " +
                                std::to_string(allowed[r].size()) + " words, " +
                                std::to_string(words) + " expected");
      }
      std::memcpy(masks + static_cast<size_t>(count) * words, allowed[r].data(),
                  words * sizeof(int32_t));
      index[r] = count++;
    }
    if (count == 0) return {};
    // The index region is max_num_seqs long; copy it whole, then the masks used.
    const size_t bytes =
        (static_cast<size_t>(context_.limits().max_num_seqs) + static_cast<size_t>(count) * words) *
        sizeof(int32_t);
    PDS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(masks_device_.data(), masks_host_.data(), bytes,
                                             cudaMemcpyHostToDevice, stream_));
    args.mask_index = masks_device_.as<int32_t>();
    args.masks = masks_device_.as<int32_t>() + context_.limits().max_num_seqs;
    args.mask_words = mask_words_;
    return {};
  }

  // Page-locked room for `rows` logits rows; grows (rarely: only logprobs need it) and never
  // shrinks.
  Status reserve_fetched_rows(size_t rows) {
    const size_t bytes = rows * static_cast<size_t>(vocab_) * sizeof(float);
    if (bytes <= fetched_host_.size()) return {};
    PDS_ASSIGN_OR_RETURN(fetched_host_, backend_.allocate_host(bytes));
    return {};
  }

  Backend& backend_;
  ForwardContext& context_;
  cudaStream_t stream_;
  int vocab_;
  int mask_words_ = 0;
  std::unique_ptr<DecodeGraphRunner> steps_;
  SamplingInputPacker packer_;
  // The launched step's.
  bool launched_ = false;
  std::vector<SamplingRow> rows_;
  std::vector<int32_t> logits_rows_;
  std::vector<SampleOutcome> outcomes_;
  PackedSampling packed_;
  std::byte* sampling_inputs_ = nullptr;  // device address of the packed rows
  DeviceBuffer masks_device_;
  HostBuffer masks_host_;
  DeviceBuffer results_device_;
  HostBuffer results_host_;
  HostBuffer fetched_host_;
};

}  // namespace

Result<std::unique_ptr<DeviceStepPath>> make_cuda_step_path(Backend& backend, Qwen3Model& model,
                                                            KvCache& cache, ForwardContext& context,
                                                            int scratch_block, bool cuda_graphs) {
  return CudaStepPath::create(backend, model, cache, context, scratch_block, cuda_graphs);
}

Result<DeviceMemoryInfo> device_memory_info(Backend& backend) {
  PDS_ASSIGN_OR_RETURN(const CudaMemoryInfo info, cuda_memory_info(backend));
  return DeviceMemoryInfo{info.free_bytes, info.total_bytes};
}

}  // namespace pdserve
