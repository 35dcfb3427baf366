// A node's warm-up: one short request through its freshly started engine before the node
// serves or joins a cluster. Its steps touch the weights' pages and the kernels' first-use
// setup (cuBLAS handles and workspaces on CUDA), so the first client does not pay for them;
// and a model that cannot run a step stops the node before it is ready for traffic.
#pragma once

#include <chrono>

#include "common/core/status.h"
#include "common/engine/inference_service.h"

namespace pdserve {

struct WarmUpReport {
  std::chrono::milliseconds elapsed{0};
  int generated_tokens = 0;
};

// Prefills a few tokens and decodes two greedily (one prefill step, one decode step). The
// request's error when the model fails; DeadlineExceeded (the request aborted) when it has not
// finished within `deadline`.
Result<WarmUpReport> warm_up(InferenceService& service, std::chrono::milliseconds deadline);

}  // namespace pdserve
