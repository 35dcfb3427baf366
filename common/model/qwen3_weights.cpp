#include "common/model/qwen3_weights.h"

#include <cstdint>
#include <cstring>
#include <set>
#include <string>

#include "common/model/fp8_weight_scales.h"
#include "common/model/host_buffer.h"
#include "common/model/parallel_for.h"
#include "common/model/qwen3_layout.h"
#include "common/model/tensor_shape.h"

namespace pdserve {
namespace {

// Same order as qwen3_tensor_specs lists a layer's tensors.
constexpr HostTensor Qwen3LayerWeights::*kLayerSlots[] = {
    &Qwen3LayerWeights::input_layernorm, &Qwen3LayerWeights::q_proj,
    &Qwen3LayerWeights::k_proj,          &Qwen3LayerWeights::v_proj,
    &Qwen3LayerWeights::o_proj,          &Qwen3LayerWeights::q_norm,
    &Qwen3LayerWeights::k_norm,          &Qwen3LayerWeights::post_attention_layernorm,
    &Qwen3LayerWeights::gate_proj,       &Qwen3LayerWeights::up_proj,
    &Qwen3LayerWeights::down_proj,
};
static_assert(std::size(kLayerSlots) == kQwen3TensorsPerLayer);

// Elements per conversion task: large enough to amortise scheduling, small enough to balance.
constexpr size_t kConversionGrain = size_t{1} << 20;

struct Conversion {
  const std::byte* src;
  DType from;
  std::byte* dst;
  DType to;
  size_t count;
};

void convert_range(const Conversion& job, size_t begin, size_t end) {
  convert_elements(job.src + begin * dtype_size(job.from), job.from,
                   job.dst + begin * dtype_size(job.to), job.to, end - begin);
}

void run_conversions(const std::vector<Conversion>& jobs) {
  // Flatten (job, chunk) pairs so that one big tensor is spread over every thread.
  std::vector<std::pair<size_t, size_t>> tasks;  // (job index, first element)
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (size_t first = 0; first < jobs[j].count; first += kConversionGrain) {
      tasks.emplace_back(j, first);
    }
  }
  parallel_for(tasks.size(), 1, [&](size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t) {
      const Conversion& job = jobs[tasks[t].first];
      size_t first = tasks[t].second;
      convert_range(job, first, std::min(job.count, first + kConversionGrain));
    }
  });
}

bool aligned_for(const std::byte* data, DType dtype) {
  return reinterpret_cast<uintptr_t>(data) % dtype_size(dtype) == 0;
}

std::string name_list(const std::vector<std::string>& names) {
  constexpr size_t kShown = 8;
  std::string text;
  for (size_t i = 0; i < names.size() && i < kShown; ++i) {
    text += (i > 0 ? ", '" : "'") + names[i] + "'";
  }
  if (names.size() > kShown) text += ", ... (" + std::to_string(names.size()) + " in all)";
  return text;
}

Status check_shape(const TensorView& view, const TensorSpec& spec, const Checkpoint& checkpoint) {
  if (view.shape == spec.shape) return {};
  return invalid_argument("tensor '" + spec.name + "' in '" + checkpoint.dir().string() +
                          "' has shape " + shape_string(view.shape) + ", expected " +
                          shape_string(spec.shape) + " from config.json");
}

Status check_tensor_names(const Checkpoint& checkpoint, const std::vector<TensorSpec>& specs) {
  std::set<std::string> expected;
  std::vector<std::string> missing;
  for (const TensorSpec& spec : specs) {
    expected.insert(spec.name);
    if (!checkpoint.has_tensor(spec.name)) missing.push_back(spec.name);
  }
  if (!missing.empty()) {
    return not_found("checkpoint '" + checkpoint.dir().string() + "' lacks " +
                     std::to_string(missing.size()) +
                     " tensor(s) its config.json requires: " + name_list(missing));
  }
  std::vector<std::string> unexpected;
  const bool quantized = checkpoint.config().quantization.has_value();
  for (const std::string& name : checkpoint.tensor_names()) {
    bool tied_head = name == kLmHeadName && checkpoint.config().tie_word_embeddings;
    // An FP8 weight's scales (their owner's dtype decides whether they are used).
    bool scale = quantized && is_fp8_scale_name(name) && expected.contains(fp8_scale_owner(name));
    if (!expected.contains(name) && !tied_head && !scale) unexpected.push_back(name);
  }
  if (!unexpected.empty()) {
    return invalid_argument(
        "checkpoint '" + checkpoint.dir().string() + "' has " + std::to_string(unexpected.size()) +
        " tensor(s) a Qwen3 model with this config.json does not use: " + name_list(unexpected));
  }
  return {};
}

// FP8 codes mean nothing without the quantization_config that says how they are scaled.
Status check_fp8_is_declared(const Checkpoint& checkpoint, const std::vector<TensorSpec>& specs) {
  if (checkpoint.config().quantization) return {};
  for (const TensorSpec& spec : specs) {
    Result<TensorView> view = checkpoint.tensor(spec.name);
    if (view.ok() && view->dtype == DType::kF8E4M3) {
      return invalid_argument("tensor '" + spec.name + "' is FP8 (F8_E4M3) but '" +
                              checkpoint.dir().string() +
                              "/config.json' has no quantization_config to say how it is scaled");
    }
  }
  return {};
}

}  // namespace

int64_t HostTensor::numel() const {
  return checked_numel(shape).value_or(0);
}

size_t HostTensor::nbytes() const {
  return static_cast<size_t>(numel()) * dtype_size(dtype);
}

int64_t HostTensor::scale_count() const {
  if (scale == nullptr || shape.size() != 2 || scale_block_n <= 0 || scale_block_k <= 0) return 0;
  return ((shape[0] + scale_block_n - 1) / scale_block_n) *
         ((shape[1] + scale_block_k - 1) / scale_block_k);
}

namespace {

Result<Qwen3Weights> load_weights(const Checkpoint& checkpoint, DType compute_dtype,
                                  WeightPlacement placement) {
  const ModelConfig& config = checkpoint.config();
  const bool tied = config.tie_word_embeddings;
  const std::vector<TensorSpec> specs = qwen3_tensor_specs(config, /*with_lm_head=*/!tied);
  PDS_RETURN_IF_ERROR(check_fp8_is_declared(checkpoint, specs));
  PDS_RETURN_IF_ERROR(check_tensor_names(checkpoint, specs));
  if (tied && checkpoint.has_tensor(kLmHeadName)) {
    // Stored but unused: transformers ties it to the embeddings. Its shape must still agree.
    PDS_ASSIGN_OR_RETURN(TensorView head, checkpoint.tensor(kLmHeadName));
    PDS_RETURN_IF_ERROR(check_shape(head, {kLmHeadName, specs.front().shape}, checkpoint));
  }

  Qwen3Weights weights;
  weights.config = config;
  weights.layers.resize(static_cast<size_t>(config.num_hidden_layers));
  std::vector<HostTensor*> slots;
  slots.push_back(&weights.embed_tokens);
  for (Qwen3LayerWeights& layer : weights.layers) {
    for (HostTensor Qwen3LayerWeights::*slot : kLayerSlots) slots.push_back(&(layer.*slot));
  }
  slots.push_back(&weights.final_norm);
  if (!tied) slots.push_back(&weights.lm_head);
  PDS_CHECK(slots.size() == specs.size(), "Qwen3 layout and weight slots disagree");

  std::vector<Conversion> conversions;
  for (size_t i = 0; i < specs.size(); ++i) {
    PDS_ASSIGN_OR_RETURN(TensorView view, checkpoint.tensor(specs[i].name));
    PDS_RETURN_IF_ERROR(check_shape(view, specs[i], checkpoint));
    HostTensor& tensor = *slots[i];
    tensor.shape = view.shape;
    // FP8 linear weights stay 1-byte codes with their scales; the rest take the compute dtype.
    const bool fp8 = view.dtype == DType::kF8E4M3;
    if (fp8) {
      PDS_RETURN_IF_ERROR(attach_fp8_scales(checkpoint, specs[i], tensor));
    } else if (checkpoint.config().quantization) {
      PDS_RETURN_IF_ERROR(refuse_scale_of_unquantized(checkpoint, specs[i].name));
    }
    const DType dtype = fp8 ? DType::kF8E4M3 : compute_dtype;
    tensor.dtype = dtype;
    if (placement == WeightPlacement::kMapWhereTheFileAllows && view.dtype == dtype &&
        aligned_for(view.data, dtype)) {
      tensor.data = view.data;
      tensor.keep_alive = std::move(view.keep_alive);
      continue;
    }
    size_t count = static_cast<size_t>(view.numel());
    std::shared_ptr<std::byte[]> buffer = allocate_host_buffer(count * dtype_size(dtype));
    conversions.push_back({view.data, view.dtype, buffer.get(), dtype, count});
    tensor.data = buffer.get();
    tensor.keep_alive = std::move(buffer);
  }
  run_conversions(conversions);
  if (tied) weights.lm_head = weights.embed_tokens;
  return weights;
}

}  // namespace

Result<Qwen3Weights> load_qwen3_weights(const Checkpoint& checkpoint, DType compute_dtype,
                                       WeightPlacement placement) {
  // Allocation failures surface as RESOURCE_EXHAUSTED instead of escaping.
  return capture_status([&] { return load_weights(checkpoint, compute_dtype, placement); });
}

}  // namespace pdserve
