#include "kernels/cuda_graph.h"

#include <utility>

#include "kernels/cuda_check.h"

namespace pdserve {

Result<CudaGraph> CudaGraph::capture(cudaStream_t stream, const std::function<Status()>& record) {
  PDS_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const Status recorded = record();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (!recorded.ok()) {
    if (graph != nullptr) static_cast<void>(cudaGraphDestroy(graph));
    return recorded.with_context("while capturing a CUDA graph");
  }
  PDS_CUDA_RETURN_IF_ERROR(ended);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  if (instantiated != cudaSuccess) {
    static_cast<void>(cudaGraphDestroy(graph));
    PDS_CUDA_RETURN_IF_ERROR(instantiated);
  }
  return CudaGraph(graph, exec);
}

CudaGraph::CudaGraph(CudaGraph&& other) noexcept {
  *this = std::move(other);
}

CudaGraph& CudaGraph::operator=(CudaGraph&& other) noexcept {
  if (this != &other) {
    reset();
    graph_ = std::exchange(other.graph_, nullptr);
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}

CudaGraph::~CudaGraph() {
  reset();
}

void CudaGraph::reset() noexcept {
  if (exec_ != nullptr) static_cast<void>(cudaGraphExecDestroy(exec_));
  if (graph_ != nullptr) static_cast<void>(cudaGraphDestroy(graph_));
  exec_ = nullptr;
  graph_ = nullptr;
}

Status CudaGraph::replay(cudaStream_t stream) const {
  PDS_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec_, stream));
  return {};
}

}  // namespace pdserve
