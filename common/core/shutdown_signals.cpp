#include "common/core/shutdown_signals.h"

#include <pthread.h>

namespace pdserve {

sigset_t block_shutdown_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

int wait_for_shutdown_signal(const sigset_t& signals) {
  int received = 0;
  sigwait(&signals, &received);
  return received;
}

}  // namespace pdserve
