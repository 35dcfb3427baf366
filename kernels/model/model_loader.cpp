#include "kernels/model/model_loader.h"

#include "common/model/model_path.h"
#include "common/model/qwen3_weights.h"

namespace pdserve {

std::vector<int32_t> LoadedModel::eos_token_ids() const {
  const std::vector<int>& ids = generation_config.eos_token_ids.empty()
                                    ? model->config().eos_token_ids
                                    : generation_config.eos_token_ids;
  return {ids.begin(), ids.end()};
}

SamplingDefaults LoadedModel::sampling_defaults() const {
  SamplingDefaults defaults;
  defaults.temperature = generation_config.temperature;
  defaults.top_p = generation_config.top_p;
  defaults.top_k = generation_config.top_k;
  return defaults;
}

Result<ModelLoadOptions> model_load_options(std::string_view device, int threads,
                                            std::string_view dtype) {
  ModelLoadOptions options;
  PDS_ASSIGN_OR_RETURN(const DeviceSpec spec, parse_device(device));
  options.backend.device = spec.kind;
  options.backend.device_index = spec.index;
  options.backend.num_threads = threads;
  if (!dtype.empty()) {
    PDS_ASSIGN_OR_RETURN(DType parsed, parse_dtype(dtype));
    options.dtype = parsed;
    // On the CPU --dtype picks how the weights are stored (it always computes in float32);
    // on CUDA it is also what the device computes in, and create_backend refuses a dtype it
    // cannot compute in rather than running another one.
    if (options.backend.device == DeviceKind::kCuda) options.backend.activation_dtype = parsed;
  }
  return options;
}

Result<LoadedModel> load_model(std::string_view model_spec, const ModelLoadOptions& options) {
  LoadedModel loaded;
  PDS_ASSIGN_OR_RETURN(loaded.model_dir, resolve_model_path(model_spec));
  loaded.default_name = default_served_model_name(model_spec, loaded.model_dir);
  // The device is checked before the (slow) weight load so a bad --device fails at once.
  PDS_ASSIGN_OR_RETURN(loaded.backend, create_backend(options.backend));
  PDS_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open(loaded.model_dir));
  loaded.generation_config = checkpoint.generation_config();
  // A backend with its own memory holds the weights in its compute dtype (bfloat16 by default
  // on CUDA, as vLLM's "auto" for float32 checkpoints); reading them in it saves a conversion.
  const DType dtype = loaded.backend->shares_host_memory()
                          ? options.dtype.value_or(checkpoint.config().torch_dtype)
                          : loaded.backend->activation_dtype();
  // The host computes on the weights themselves: on huge pages, unless asked to share the
  // page cache. A device copies them from the mmap.
  const WeightPlacement placement =
      loaded.backend->shares_host_memory() && !options.weights_mmap
          ? WeightPlacement::kHostHugePages
          : WeightPlacement::kMapWhereTheFileAllows;
  PDS_ASSIGN_OR_RETURN(Qwen3Weights weights, load_qwen3_weights(checkpoint, dtype, placement));
  PDS_ASSIGN_OR_RETURN(loaded.model, Qwen3Model::create(*loaded.backend, std::move(weights)));
  return loaded;
}

}  // namespace pdserve
