#include "kv_transfer/ucx_handles.h"

#include <chrono>

namespace pdserve::kv_transfer {
namespace {

// A forced close completes locally; this only bounds a misbehaving transport.
constexpr auto kCloseTimeout = std::chrono::seconds(2);

struct ConfigDeleter {
  void operator()(ucp_config_t* config) const { ucp_config_release(config); }
};

}  // namespace

Status ucx_error(ucs_status_t status, const std::string& what) {
  const std::string message = what + ": " + ucs_status_string(status);
  switch (status) {
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_EXCEEDS_LIMIT:
      return resource_exhausted(message);
    case UCS_ERR_TIMED_OUT:
      return deadline_exceeded(message);
    case UCS_ERR_CANCELED:
      return cancelled(message);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return invalid_argument(message);
    case UCS_ERR_UNSUPPORTED:
      return unimplemented(message);
    default:
      return unavailable(message);
  }
}

Result<std::unique_ptr<UcpContext>> UcpContext::create(const std::string& transports) {
  ucp_config_t* raw_config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &raw_config);
  if (status != UCS_OK) return ucx_error(status, "ucp_config_read");
  std::unique_ptr<ucp_config_t, ConfigDeleter> config(raw_config);
  if (!transports.empty()) {
    status = ucp_config_modify(config.get(), "TLS", transports.c_str());
    if (status != UCS_OK) return ucx_error(status, "UCX transports '" + transports + "'");
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
  ucp_context_h handle = nullptr;
  status = ucp_init(&params, config.get(), &handle);
  if (status != UCS_OK) {
    return ucx_error(status, "ucp_init (transports '" + transports + "')");
  }
  ucp_context_attr_t attributes{};
  attributes.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  status = ucp_context_query(handle, &attributes);
  if (status != UCS_OK) {
    ucp_cleanup(handle);
    return ucx_error(status, "ucp_context_query");
  }
  const bool cuda = (attributes.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  return std::unique_ptr<UcpContext>(new UcpContext(handle, cuda));
}

UcpContext::~UcpContext() {
  ucp_cleanup(handle_);
}

Result<std::unique_ptr<UcpWorker>> UcpWorker::create(const UcpContext& context) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h handle = nullptr;
  ucs_status_t status = ucp_worker_create(context.get(), &params, &handle);
  if (status != UCS_OK) return ucx_error(status, "ucp_worker_create");
  ucp_address_t* raw_address = nullptr;
  std::size_t address_length = 0;
  status = ucp_worker_get_address(handle, &raw_address, &address_length);
  if (status != UCS_OK) {
    ucp_worker_destroy(handle);
    return ucx_error(status, "ucp_worker_get_address");
  }
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(raw_address);
  std::vector<std::uint8_t> address(bytes, bytes + address_length);
  ucp_worker_release_address(handle, raw_address);
  return std::unique_ptr<UcpWorker>(new UcpWorker(handle, std::move(address)));
}

UcpWorker::~UcpWorker() {
  ucp_worker_destroy(handle_);
}

Result<std::unique_ptr<UcpEndpoint>> UcpEndpoint::create(const UcpWorker& worker,
                                                         const std::vector<std::uint8_t>& address,
                                                         bool detect_peer_failure,
                                                         ucp_err_handler_cb_t on_error,
                                                         void* error_arg) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  params.err_mode = detect_peer_failure ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  params.err_handler.cb = on_error;
  params.err_handler.arg = error_arg;
  ucp_ep_h handle = nullptr;
  const ucs_status_t status = ucp_ep_create(worker.get(), &params, &handle);
  if (status != UCS_OK) return ucx_error(status, "ucp_ep_create to a peer worker");
  return std::unique_ptr<UcpEndpoint>(new UcpEndpoint(worker.get(), handle));
}

UcpEndpoint::~UcpEndpoint() {
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* request = ucp_ep_close_nbx(handle_, &params);
  if (request == nullptr || UCS_PTR_IS_ERR(request)) return;
  const auto deadline = std::chrono::steady_clock::now() + kCloseTimeout;
  while (ucp_request_check_status(request) == UCS_INPROGRESS &&
         std::chrono::steady_clock::now() < deadline) {
    ucp_worker_progress(worker_);
  }
  ucp_request_free(request);
}

Result<std::unique_ptr<MemoryRegion>> MemoryRegion::create(const UcpContext& context, void* base,
                                                           std::size_t bytes, bool cuda_memory) {
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  params.address = base;
  params.length = bytes;
  params.memory_type = cuda_memory ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
  ucp_mem_h handle = nullptr;
  ucs_status_t status = ucp_mem_map(context.get(), &params, &handle);
  if (status != UCS_OK) {
    return ucx_error(status, "ucp_mem_map of " + std::to_string(bytes) + " bytes");
  }
  void* raw_rkey = nullptr;
  std::size_t rkey_length = 0;
  status = ucp_rkey_pack(context.get(), handle, &raw_rkey, &rkey_length);
  if (status != UCS_OK) {
    ucp_mem_unmap(context.get(), handle);
    return ucx_error(status, "ucp_rkey_pack");
  }
  const auto* rkey_bytes = static_cast<const std::uint8_t*>(raw_rkey);
  std::vector<std::uint8_t> packed(rkey_bytes, rkey_bytes + rkey_length);
  ucp_rkey_buffer_release(raw_rkey);
  return std::unique_ptr<MemoryRegion>(new MemoryRegion(context.get(), handle, std::move(packed)));
}

MemoryRegion::~MemoryRegion() {
  ucp_mem_unmap(context_, handle_);
}

Result<std::unique_ptr<RemoteKey>> RemoteKey::create(const UcpEndpoint& endpoint,
                                                     const std::vector<std::uint8_t>& packed) {
  ucp_rkey_h handle = nullptr;
  const ucs_status_t status = ucp_ep_rkey_unpack(endpoint.get(), packed.data(), &handle);
  if (status != UCS_OK) return ucx_error(status, "ucp_ep_rkey_unpack of the peer's pool key");
  return std::unique_ptr<RemoteKey>(new RemoteKey(handle));
}

RemoteKey::~RemoteKey() {
  ucp_rkey_destroy(handle_);
}

}  // namespace pdserve::kv_transfer
