#include "tests/http/scripted_server.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <stdexcept>

namespace pdserve::testing {
namespace {

// The Content-Length of a request head, or 0.
size_t content_length(const std::string& head) {
  for (const char* name : {"\r\nContent-Length:", "\r\ncontent-length:"}) {
    if (const size_t at = head.find(name); at != std::string::npos) {
      return std::strtoull(head.c_str() + at + std::string(name).size(), nullptr, 10);
    }
  }
  return 0;
}

}  // namespace

ScriptedServer::ScriptedServer(std::string reply, bool close_after_reply)
    : reply_(std::move(reply)), close_after_reply_(close_after_reply) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      ::listen(listen_fd_, 16) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    throw std::runtime_error("ScriptedServer: cannot listen on 127.0.0.1");
  }
  port_ = ntohs(address.sin_port);
  acceptor_ = std::thread([this] { accept_loop(); });
}

ScriptedServer::~ScriptedServer() {
  stopping_ = true;
  acceptor_.join();
  {
    std::lock_guard lock(mutex_);
    for (const int fd : connections_) ::shutdown(fd, SHUT_RDWR);
  }
  for (std::thread& worker : workers_) worker.join();
  ::close(listen_fd_);
}

std::string ScriptedServer::last_request() {
  std::lock_guard lock(mutex_);
  return last_request_;
}

void ScriptedServer::accept_loop() {
  while (!stopping_) {
    pollfd ready{listen_fd_, POLLIN, 0};
    if (::poll(&ready, 1, 20) <= 0) continue;  // wakes up to notice stopping_
    const int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) continue;
    std::lock_guard lock(mutex_);
    connections_.push_back(fd);
    workers_.emplace_back([this, fd] { serve(fd); });
  }
}

void ScriptedServer::serve(int fd) {
  std::string request;
  char buffer[65536];
  size_t head_end = std::string::npos;
  while (head_end == std::string::npos ||
         request.size() < head_end + 4 + content_length(request.substr(0, head_end))) {
    const ssize_t got = ::recv(fd, buffer, sizeof(buffer), 0);
    if (got <= 0) break;
    request.append(buffer, static_cast<size_t>(got));
    if (head_end == std::string::npos) head_end = request.find("\r\n\r\n");
  }
  if (head_end != std::string::npos) {
    ++requests_;
    {
      std::lock_guard lock(mutex_);
      last_request_ = request;
    }
    for (size_t sent = 0; sent < reply_.size();) {
      const ssize_t put = ::send(fd, reply_.data() + sent, reply_.size() - sent, MSG_NOSIGNAL);
      if (put <= 0) break;  // the client left
      sent += static_cast<size_t>(put);
    }
  }
  if (close_after_reply_) ::shutdown(fd, SHUT_WR);
  while (::recv(fd, buffer, sizeof(buffer), 0) > 0) {
  }  // until the client closes, or the destructor shuts the socket down
  {
    std::lock_guard lock(mutex_);
    std::erase(connections_, fd);
  }
  ::close(fd);
}

}  // namespace pdserve::testing
