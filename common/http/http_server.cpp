#include "common/http/http_server.h"

#include <condition_variable>
#include <exception>
#include <optional>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "common/core/log.h"
#include "common/http/connection.h"

namespace pdserve::http {
namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {
// Pause after a failed accept (e.g. out of file descriptors) so the loop does not spin.
constexpr std::chrono::milliseconds kAcceptRetryDelay{50};
}  // namespace

struct HttpServer::Impl {
  explicit Impl(std::shared_ptr<detail::ServerState> server_state)
      : work(asio::make_work_guard(io)),
        acceptor(asio::make_strand(io)),
        retry_timer(acceptor.get_executor()),
        state(std::move(server_state)) {}

  void accept() {
    acceptor.async_accept(asio::make_strand(io), [this](const error_code& ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
      if (ec) {
        PDS_LOG_WARN("accept failed: " + ec.message());
        retry_timer.expires_after(kAcceptRetryDelay);
        retry_timer.async_wait([this](const error_code& wait_ec) {
          if (!wait_ec) accept();
        });
        return;
      }
      error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      std::make_shared<detail::Connection>(std::move(socket), state)->start();
      accept();
    });
  }

  void run_thread() {
    try {
      io.run();
    } catch (const std::exception& e) {
      PDS_LOG_ERROR(std::string("an I/O thread stopped on an exception: ") + e.what());
    }
    std::lock_guard lock(run_mutex);
    --running;
    run_cv.notify_all();
  }

  asio::io_context io;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  tcp::acceptor acceptor;
  asio::steady_timer retry_timer;
  std::shared_ptr<detail::ServerState> state;
  uint16_t port = 0;
  std::vector<std::thread> threads;
  std::mutex run_mutex;
  std::condition_variable run_cv;
  int running = 0;
  bool stopped = false;
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() {
  stop();
}

uint16_t HttpServer::port() const {
  return impl_->port;
}

Result<std::unique_ptr<HttpServer>> HttpServer::start(const ServerOptions& options,
                                                      RouteTable routes) {
  if (options.threads < 1) return invalid_argument("the server needs at least one I/O thread");
  if (options.max_body_bytes == 0) return invalid_argument("max_body_bytes must be positive");
  auto impl =
      std::make_unique<Impl>(std::make_shared<detail::ServerState>(options, std::move(routes)));

  const std::string where = options.host + ":" + std::to_string(options.port);
  error_code ec;
  tcp::resolver resolver(impl->io);
  const auto endpoints =
      resolver.resolve(options.host, std::to_string(options.port),
                       tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || endpoints.empty()) {
    return invalid_argument("cannot resolve the listen address " + where + ": " + ec.message());
  }
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  auto& acceptor = impl->acceptor;
  if (acceptor.open(endpoint.protocol(), ec) ||
      acceptor.set_option(asio::socket_base::reuse_address(true), ec) ||
      acceptor.bind(endpoint, ec) ||
      acceptor.listen(asio::socket_base::max_listen_connections, ec)) {
    return unavailable("cannot listen on " + where + ": " + ec.message());
  }
  impl->port = acceptor.local_endpoint(ec).port();
  if (ec) return unavailable("cannot read the bound port of " + where + ": " + ec.message());

  impl->accept();
  impl->running = options.threads;
  for (int i = 0; i < options.threads; ++i) {
    impl->threads.emplace_back([raw = impl.get()] { raw->run_thread(); });
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

void HttpServer::stop() {
  Impl& impl = *impl_;
  if (impl.stopped) return;
  impl.stopped = true;

  asio::post(impl.acceptor.get_executor(), [&impl] {
    error_code ignored;
    impl.acceptor.close(ignored);
    impl.retry_timer.cancel();
  });
  std::vector<std::shared_ptr<detail::Connection>> open_connections;
  {
    std::lock_guard lock(impl.state->mutex);
    impl.state->accepting_posts = false;
    for (auto& [raw, weak] : impl.state->connections) {
      if (auto connection = weak.lock()) open_connections.push_back(std::move(connection));
    }
  }
  for (const auto& connection : open_connections) connection->close();
  open_connections.clear();
  impl.work.reset();

  {
    std::unique_lock lock(impl.run_mutex);
    if (!impl.run_cv.wait_for(lock, impl.state->options.shutdown_timeout,
                              [&impl] { return impl.running == 0; })) {
      PDS_LOG_WARN("HTTP server: connections did not close in time; stopping the I/O threads");
      impl.io.stop();
    }
  }
  for (std::thread& thread : impl.threads) thread.join();
  impl.threads.clear();
}

}  // namespace pdserve::http
