// Finds a model folder from what a user typed: a directory, or a hub id such as
// "Qwen/Qwen3-0.6B" that is already in the local Hugging Face cache (never downloads).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "common/core/status.h"

namespace pdserve {

// The hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub.
std::filesystem::path hf_hub_cache_dir();

// An existing directory is returned as is. A hub id "org/name" resolves to
// <cache>/models--org--name/snapshots/<hash>, where <hash> is refs/main, falling back to the
// only (or newest) snapshot. NOT_FOUND says where it looked.
Result<std::filesystem::path> resolve_model_path(std::string_view spec);

// The name a model is served under by default (vLLM's rule: what the user typed): the hub id
// when `spec` resolved through the hub cache (not the snapshot folder's hash), else the name of
// the model folder `resolved`.
std::string default_served_model_name(std::string_view spec, const std::filesystem::path& resolved);

}  // namespace pdserve
