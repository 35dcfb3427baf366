// RAII owners of UCP handles (private to kv_transfer/: the only header that includes UCX).
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/core/status.h"

namespace pdserve::kv_transfer {

// A Status naming what failed and UCX's own reason.
Status ucx_error(ucs_status_t status, const std::string& what);

// A UCP context with RMA and active messages. `transports` (e.g. "tcp", "sm,self") overrides
// UCX_TLS for this context only; empty keeps UCX's choice.
class UcpContext {
 public:
  static Result<std::unique_ptr<UcpContext>> create(const std::string& transports);
  ~UcpContext();
  UcpContext(const UcpContext&) = delete;
  UcpContext& operator=(const UcpContext&) = delete;
  ucp_context_h get() const { return handle_; }
  // Whether this UCX build loaded a transport that reads and writes CUDA device memory
  // (cuda_copy, cuda_ipc, or RDMA with GPUDirect): asked of UCX at run time.
  bool supports_cuda_memory() const { return supports_cuda_memory_; }

 private:
  UcpContext(ucp_context_h handle, bool supports_cuda_memory)
      : handle_(handle), supports_cuda_memory_(supports_cuda_memory) {}
  ucp_context_h handle_;
  bool supports_cuda_memory_;
};

// A single-threaded worker; progressed only by its owner's thread.
class UcpWorker {
 public:
  static Result<std::unique_ptr<UcpWorker>> create(const UcpContext& context);
  ~UcpWorker();
  UcpWorker(const UcpWorker&) = delete;
  UcpWorker& operator=(const UcpWorker&) = delete;
  ucp_worker_h get() const { return handle_; }
  const std::vector<std::uint8_t>& address() const { return address_; }

 private:
  UcpWorker(ucp_worker_h handle, std::vector<std::uint8_t> address)
      : handle_(handle), address_(std::move(address)) {}
  ucp_worker_h handle_;
  std::vector<std::uint8_t> address_;
};

// An endpoint to a peer worker. `detect_peer_failure` asks UCX to report a dead peer through
// `on_error` (UCP_ERR_HANDLING_MODE_PEER); not every transport supports it (UCX 1.13's shared
// memory does not). Closing is forced (outstanding operations end with an error) and bounded.
class UcpEndpoint {
 public:
  static Result<std::unique_ptr<UcpEndpoint>> create(const UcpWorker& worker,
                                                     const std::vector<std::uint8_t>& address,
                                                     bool detect_peer_failure,
                                                     ucp_err_handler_cb_t on_error,
                                                     void* error_arg);
  ~UcpEndpoint();
  UcpEndpoint(const UcpEndpoint&) = delete;
  UcpEndpoint& operator=(const UcpEndpoint&) = delete;
  ucp_ep_h get() const { return handle_; }

 private:
  UcpEndpoint(ucp_worker_h worker, ucp_ep_h handle) : worker_(worker), handle_(handle) {}
  ucp_worker_h worker_;
  ucp_ep_h handle_;
};

// A registered (pinned, remotely writable) memory region and its packed remote key.
class MemoryRegion {
 public:
  // `cuda_memory`: the range is CUDA device memory (the context must support it).
  static Result<std::unique_ptr<MemoryRegion>> create(const UcpContext& context, void* base,
                                                      std::size_t bytes, bool cuda_memory);
  ~MemoryRegion();
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;
  const std::vector<std::uint8_t>& packed_rkey() const { return packed_rkey_; }

 private:
  MemoryRegion(ucp_context_h context, ucp_mem_h handle, std::vector<std::uint8_t> packed_rkey)
      : context_(context), handle_(handle), packed_rkey_(std::move(packed_rkey)) {}
  ucp_context_h context_;
  ucp_mem_h handle_;
  std::vector<std::uint8_t> packed_rkey_;
};

// A peer's remote key, unpacked for one endpoint.
class RemoteKey {
 public:
  static Result<std::unique_ptr<RemoteKey>> create(const UcpEndpoint& endpoint,
                                                   const std::vector<std::uint8_t>& packed);
  ~RemoteKey();
  RemoteKey(const RemoteKey&) = delete;
  RemoteKey& operator=(const RemoteKey&) = delete;
  ucp_rkey_h get() const { return handle_; }

 private:
  explicit RemoteKey(ucp_rkey_h handle) : handle_(handle) {}
  ucp_rkey_h handle_;
};

}  // namespace pdserve::kv_transfer
