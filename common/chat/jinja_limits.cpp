#include "common/chat/jinja_limits.h"

#include "common/chat/jinja_error.h"

namespace pdserve::jinja {

void Budget::step() {
  if (++steps_ > limits_.max_steps) {
    fail_resource("render exceeded " + std::to_string(limits_.max_steps) + " evaluation steps");
  }
}

void Budget::check_string(size_t bytes) {
  if (bytes > limits_.max_string_bytes) {
    fail_resource("string of " + std::to_string(bytes) + " bytes exceeds the limit of " +
                  std::to_string(limits_.max_string_bytes));
  }
  total_bytes_ += bytes;
  if (total_bytes_ > limits_.max_total_bytes) {
    fail_resource("render built more than " + std::to_string(limits_.max_total_bytes) +
                  " bytes of strings");
  }
}

void Budget::check_list(size_t items) {
  if (items > limits_.max_list_items) {
    fail_resource("list of " + std::to_string(items) + " items exceeds the limit of " +
                  std::to_string(limits_.max_list_items));
  }
}

void Budget::enter() {
  if (++depth_ > limits_.max_depth) {
    --depth_;
    fail_resource("render nested deeper than " + std::to_string(limits_.max_depth) +
                  " levels (runaway recursion?)");
  }
}

}  // namespace pdserve::jinja
