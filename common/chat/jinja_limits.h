// Resource bounds of one render, so that a hostile template or context cannot crash, hang or
// exhaust the process: nesting depth, evaluation steps, list and string sizes, and the total
// bytes of strings built.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pdserve::jinja {

struct RenderLimits {
  int max_depth = 384;                    // nested statements + expressions + macro calls
  uint64_t max_steps = 5'000'000;         // evaluated nodes and loop iterations
  size_t max_string_bytes = 64u << 20;    // any one string, the output included
  size_t max_list_items = 1u << 20;       // any one list
  uint64_t max_total_bytes = 1ull << 30;  // all strings built during the render
};

class Budget {
 public:
  explicit Budget(const RenderLimits& limits) : limits_(limits) {}

  void step();
  void check_string(size_t bytes);
  void check_list(size_t items);
  void enter();
  void leave() { --depth_; }
  const RenderLimits& limits() const { return limits_; }

 private:
  RenderLimits limits_;
  int depth_ = 0;
  uint64_t steps_ = 0;
  uint64_t total_bytes_ = 0;
};

// Counts one level of depth for as long as it lives.
class DepthScope {
 public:
  explicit DepthScope(Budget& budget) : budget_(budget) { budget_.enter(); }
  ~DepthScope() { budget_.leave(); }
  DepthScope(const DepthScope&) = delete;
  DepthScope& operator=(const DepthScope&) = delete;

 private:
  Budget& budget_;
};

}  // namespace pdserve::jinja
