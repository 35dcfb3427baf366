// CUDA device discovery. Builds without CUDA answer that the build lacks it.
#pragma once

#include "common/core/status.h"

namespace pdserve {

// Number of visible CUDA devices; Unavailable when there is none, no driver, or no CUDA in
// this build (the message says which).
Result<int> cuda_device_count();

}  // namespace pdserve
