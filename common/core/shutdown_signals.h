// Clean shutdown of a server process on SIGINT / SIGTERM: block both signals before any
// thread starts (threads inherit the mask, so no thread is interrupted), then wait for one on
// the main thread and stop things in order.
#pragma once

#include <signal.h>

namespace pdserve {

// Blocks SIGINT and SIGTERM in this thread and the threads it starts later (call first).
sigset_t block_shutdown_signals();
// Waits for one of them; returns its number.
int wait_for_shutdown_signal(const sigset_t& signals);

}  // namespace pdserve
