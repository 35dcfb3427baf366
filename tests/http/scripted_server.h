// A raw-socket HTTP server for tests that answers every request with the same scripted bytes:
// what a real server (HttpServer) never sends, such as interim 1xx answers before the final
// one, 101 to a request that asked no upgrade, 204, or an event that never ends. After the
// reply the connection stays open until the client closes it or the server stops (or is
// closed at once with close_after_reply), so a client that waits for more bytes than were
// scripted waits on its own deadlines.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace pdserve::testing {

class ScriptedServer {
 public:
  explicit ScriptedServer(std::string reply, bool close_after_reply = false);
  ~ScriptedServer();
  ScriptedServer(const ScriptedServer&) = delete;
  ScriptedServer& operator=(const ScriptedServer&) = delete;

  uint16_t port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // Requests read so far, and the last one (head and body as received).
  int requests() const { return requests_; }
  std::string last_request();

 private:
  void accept_loop();
  void serve(int fd);

  const std::string reply_;
  const bool close_after_reply_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> requests_{0};
  std::mutex mutex_;
  std::string last_request_;
  std::vector<int> connections_;  // open client sockets, shut down on stop
  std::vector<std::thread> workers_;
  std::thread acceptor_;
};

}  // namespace pdserve::testing
