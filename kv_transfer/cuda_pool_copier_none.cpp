#include "kv_transfer/cuda_pool_copier.h"

namespace pdserve::kv_transfer {

Result<std::unique_ptr<PoolCopier>> make_cuda_pool_copier(void* /*pool*/,
                                                          std::uint64_t /*pool_bytes*/) {
  return unimplemented("the staging path for a CUDA KV pool needs a build with CUDA");
}

}  // namespace pdserve::kv_transfer
