// One captured CUDA Graph (RAII over cudaGraph_t / cudaGraphExec_t): the work a callback
// queues on a stream is recorded once and replayed with one launch. Used for decode steps,
// whose per-layer launches otherwise cost more than the kernels at small batch.
#pragma once

#include <cuda_runtime.h>

#include <functional>

#include "common/core/status.h"

namespace pdserve {

class CudaGraph {
 public:
  // Runs `record` with `stream` in capture mode; the stream must be the one the work is
  // queued on, and `record` must neither allocate nor synchronize (nor copy from pageable
  // host memory). A failure in `record` ends the capture and is returned.
  static Result<CudaGraph> capture(cudaStream_t stream, const std::function<Status()>& record);

  CudaGraph(CudaGraph&& other) noexcept;
  CudaGraph& operator=(CudaGraph&& other) noexcept;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  ~CudaGraph();

  // Queues the recorded work on `stream` again, reading the same device addresses.
  Status replay(cudaStream_t stream) const;

 private:
  CudaGraph(cudaGraph_t graph, cudaGraphExec_t exec) : graph_(graph), exec_(exec) {}
  void reset() noexcept;

  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace pdserve
