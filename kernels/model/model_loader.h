// Everything needed to run a model on one device, loaded from a --model argument: the
// checkpoint (kept open: the weights may be views into its memory maps), the backend and the
// placed model.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "common/model/checkpoint.h"
#include "common/sampling/sampling_params.h"
#include "kernels/backend.h"
#include "kernels/model/qwen3_model.h"

namespace pdserve {

struct ModelLoadOptions {
  BackendOptions backend;
  // The weights' dtype on a backend that shares host memory (CPU); unset: the checkpoint's
  // torch_dtype. A device backend holds them in its activation dtype (backend options).
  std::optional<DType> dtype;
  // A backend that shares host memory computes on a private copy of the weights on huge pages
  // (faster decode); true: on the checkpoint's mmap instead, whose page cache every process on
  // the machine that loads the same files shares (a prefill and a decode node on one host).
  bool weights_mmap = false;
};

// The options from the command-line words every tool takes: `--device` (cpu, cuda, cuda:N),
// `--threads`, `--dtype` (empty: the checkpoint's on the CPU, bfloat16 on CUDA; on CUDA it
// is also the compute dtype: float32 is the strict mode). InvalidArgument for an unknown name.
Result<ModelLoadOptions> model_load_options(std::string_view device, int threads,
                                            std::string_view dtype);

struct LoadedModel {
  std::filesystem::path model_dir;
  std::string default_name;  // default_served_model_name of what the user typed
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Qwen3Model> model;
  GenerationConfig generation_config;

  // The ids that end a generation: generation_config.json's, else config.json's.
  std::vector<int32_t> eos_token_ids() const;
  // generation_config.json's sampling values, for resolve_sampling_defaults.
  SamplingDefaults sampling_defaults() const;
};

// `model_spec` is a folder or a hub id found in the local Hugging Face cache.
Result<LoadedModel> load_model(std::string_view model_spec, const ModelLoadOptions& options);

}  // namespace pdserve
